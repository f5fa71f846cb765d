"""Profiling a network on one device, layer by layer, as the performance model needs it; cached on disk.

A profile is taken at one batch (a rank's batch, or a pipeline's micro-batch), precision, optimizer and
thread count on this machine's device: `WARMUP` untimed training steps, then `STEPS` timed ones, each
timed value the median over the timed steps. It holds, per layer of `suite.models.layers` (the unit a
pipeline cuts between; the last one includes the loss): forward and backward seconds, forward and backward
FLOPs (torch's FlopCounterMode, 2 per multiply-add), the bytes of its output (what a stage boundary after
it sends, and the gradient that comes back), the bytes autograd keeps for its backward, and its parameter
bytes (a tied weight counted in its first layer, and as tied in the others). Layers are timed one at a time
on the previous layer's output, which costs a little more than the same layers inside the whole network, so their times
are scaled to add up to the whole network's forward and backward, timed in the same steps as its optimizer
step; their sum is Study J's sequential measurement of a training step. Loading a batch is profiled
apart (`data_profile`), at the batch a rank reads, which a pipeline's micro-batch is not.

Profiles are JSON files under `results/profiles/`, named by what they were taken on and a digest of the
rest, so a sweep or a recommendation profiles each (network, data shape, batch, precision, optimizer,
device, threads) once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from suite.data import build_datasets
from suite.models import build_model
from suite.models.layers import flatten_layers
from suite.paths import REPO_ROOT, results_dir
from suite.runtime.optim import build_optimizer
from suite.runtime.precision import make_precision
from suite.runtime.timing import synchronize
from suite.strategies.pipeline import profile_sample
from suite.worker.trainer import loss_fn

WARMUP = 2  # untimed steps first (allocator, caches, lazy initialisation)
STEPS = 5  # timed steps; each time is their median
DATA_BATCHES = 5  # batches loaded to time the data phase (after one untimed)


@dataclass(frozen=True)
class LayerProfile:
    name: str
    forward_s: float
    backward_s: float
    forward_flops: int
    backward_flops: int
    output_bytes: int  # the layer's output: the activation a stage boundary after it sends per micro-batch
    saved_bytes: int  # what autograd keeps for this layer's backward (its parameters excluded)
    param_bytes: int  # its own parameters
    tied_bytes: int  # parameters it shares with an earlier layer (GPT-2's LM head: the token embedding)
    block: bool  # one of the network's own submodules with parameters: an FSDP unit, a checkpointing candidate


@dataclass(frozen=True)
class Profile:
    key: dict[str, Any]
    layers: tuple[LayerProfile, ...]
    input_bytes: int  # one batch of the network's input
    forward_s: float  # the whole network, loss included
    backward_s: float
    optimizer_s: float  # the point's optimizer stepping every parameter
    optimizer_state_bytes: int  # after the first step
    buffer_bytes: int  # BatchNorm statistics and the like
    warmup: int = WARMUP
    steps: int = STEPS

    @property
    def batch(self) -> int:
        return self.key["batch"]

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def step_s(self) -> float:
        """One training step without data: forward, loss, backward, optimizer (Study J's sequential measurement)."""
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def flops(self) -> int:
        """Forward and backward FLOPs of one step at this batch."""
        return sum(layer.forward_flops + layer.backward_flops for layer in self.layers)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        layers = tuple(LayerProfile(**layer) for layer in data.pop("layers"))
        return cls(layers=layers, **data)


@dataclass(frozen=True)
class DataProfile:
    key: dict[str, Any]
    batch_s: float  # loading one batch into the device, as the trainer's data phase does
    batches: int = DATA_BATCHES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataProfile:
        return cls(**data)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.machine()


def _key(cfg, batch: int, device: torch.device, threads: int, parts: tuple[str, ...]) -> dict[str, Any]:
    key = {part: OmegaConf.to_container(cfg[part], resolve=True) for part in parts}
    # How many samples there are, and where they are read from, changes neither shape nor cost of a batch.
    key["dataset"] = {k: v for k, v in key["dataset"].items() if k not in ("path", "samples", "val_samples")}
    return {**key, "batch": batch, "precision": cfg.precision, "device": f"{device.type}:{device_name(device)}",
            "threads": threads, "torch": torch.__version__}


def _cached(kind: str, key: dict[str, Any], take: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The profile of `key` from results/profiles/, or taken now and stored; and whether it was stored before."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = key.get("network", {}).get("name") or key["dataset"]["name"]
    stem = f"{kind}-{name}-b{key['batch']}-{key['precision']}-t{key['threads']}-{digest}"
    path = results_dir() / "profiles" / f"{stem}.json"
    if path.exists():
        return json.loads(path.read_text()), True
    data = {"key": key, **take()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return data, False


@contextlib.contextmanager
def _threads(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def network_profile(cfg, batch: int, device: torch.device, threads: int) -> tuple[Profile, bool]:
    """The profile of the point's network at `batch` (and whether it came from the cache)."""
    key = _key(cfg, batch, device, threads, ("network", "dataset", "optimizer"))

    def take() -> dict[str, Any]:
        with _threads(threads):
            return _profile_network(cfg, batch, device)
    data, hit = _cached("net", key, take)
    return Profile.from_json(data), hit


def data_profile(cfg, batch: int, device: torch.device, threads: int) -> tuple[DataProfile, bool]:
    key = _key(cfg, batch, device, threads, ("dataset",))

    def take() -> dict[str, Any]:
        with _threads(threads):
            return {"batch_s": _time_data(cfg, batch, device)}
    data, hit = _cached("data", key, take)
    return DataProfile.from_json(data), hit


def _phase_times(phases: list[Callable[[Any], Any]], device: torch.device) -> list[float]:
    """Median seconds of each phase over the timed steps; a step runs the phases in order, each given the
    previous one's result."""
    times: list[list[float]] = [[] for _ in phases]
    for step in range(WARMUP + STEPS):
        result = None
        for phase, phase_times in zip(phases, times):
            synchronize(device)
            start = time.perf_counter()
            result = phase(result)
            synchronize(device)
            if step >= WARMUP:
                phase_times.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _targets(cfg, batch: int) -> torch.Tensor:
    data = cfg.dataset
    if data.kind == "tokens":
        return torch.randint(0, data.vocab_size, (batch, data.seq_len))
    return torch.randint(0, data.num_classes, (batch,))


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class _SavedBytes:
    """Bytes of the distinct storages autograd saves for backward while active, parameters excluded."""

    def __init__(self, params: set[int]) -> None:
        self.params, self.storages = params, {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.params:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _profile_network(cfg, batch: int, device: torch.device) -> dict[str, Any]:
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.network, cfg.dataset).to(device).train()
    layers = flatten_layers(model)
    precision = make_precision(cfg.precision, device)
    optimizer = build_optimizer(model.parameters(), cfg.optimizer)
    inputs, targets = profile_sample(cfg, batch).to(device), _targets(cfg, batch).to(device)
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def forward(_) -> torch.Tensor:
        with precision.autocast():
            return loss_fn(model(inputs), targets)

    def step(_) -> None:
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    forward_s, backward_s, optimizer_s = _phase_times([forward, precision.backward, step], device)
    state_bytes = sum(_nbytes(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    raw = _profile_layers(layers, inputs, targets, precision, device, param_storages)
    fwd_scale = forward_s / max(sum(r["forward_s"] for r in raw), 1e-12)
    bwd_scale = backward_s / max(sum(r["backward_s"] for r in raw), 1e-12)
    for r in raw:
        r["forward_s"] *= fwd_scale
        r["backward_s"] *= bwd_scale
    return {"layers": raw, "input_bytes": _nbytes(inputs), "forward_s": forward_s, "backward_s": backward_s,
            "optimizer_s": optimizer_s, "optimizer_state_bytes": state_bytes,
            "buffer_bytes": sum(_nbytes(b) for b in model.buffers())}


def _profile_layers(layers, inputs, targets, precision, device, param_storages) -> list[dict[str, Any]]:
    """Each layer alone, on the previous layer's output (a leaf that needs gradient where it is floating)."""
    # A leaf that requires grad may not be modified in place: in-place activations that open a layer are not.
    in_place = [m for layer in layers for m in layer.module.modules() if getattr(m, "inplace", False)]
    for module in in_place:
        module.inplace = False
    seen: set[int] = set()
    out, x = [], inputs
    try:
        for index, layer in enumerate(layers):
            last = index == len(layers) - 1
            x_in = x.detach().requires_grad_(x.is_floating_point())
            params = [p for p in layer.module.parameters() if id(p) not in seen]
            tied = [p for p in layer.module.parameters() if id(p) in seen]
            seen.update(id(p) for p in params)

            def forward(_, module=layer.module, x_in=x_in, last=last) -> torch.Tensor:
                with precision.autocast():
                    y = module(x_in)
                    return loss_fn(y, targets) if last else y

            saved = _SavedBytes(param_storages)
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
                y = forward(None)
            grad = torch.ones_like(y) if last else torch.randn_like(y)
            forward_s, backward_s = _phase_times([forward, lambda out, grad=grad: out.backward(grad)], device)
            with FlopCounterMode(display=False) as fwd_count:
                y_counted = forward(None)
            with FlopCounterMode(display=False) as bwd_count:
                y_counted.backward(grad)
            layer.module.zero_grad(set_to_none=True)
            out.append(asdict(LayerProfile(
                name=layer.prefix.removesuffix(".") or type(layer.module).__name__, forward_s=forward_s,
                backward_s=backward_s, forward_flops=fwd_count.get_total_flops(),
                backward_flops=bwd_count.get_total_flops(), output_bytes=_nbytes(y), saved_bytes=saved.total,
                param_bytes=sum(_nbytes(p) for p in params), tied_bytes=sum(_nbytes(p) for p in tied),
                block=bool(layer.prefix) and any(True for _ in layer.module.parameters()))))
            x = y.detach()
    finally:
        for module in in_place:
            module.inplace = True
    return out


def _time_data(cfg, batch: int, device: torch.device) -> float:
    data = build_datasets(cfg.dataset, cfg.seed)
    workers = cfg.dataset.loader_workers
    loader = iter(DataLoader(data.train, batch, shuffle=True, drop_last=True, num_workers=workers,
                             generator=torch.Generator().manual_seed(cfg.seed)))
    times = []
    for index in range(DATA_BATCHES + 1):
        start = time.perf_counter()
        inputs, targets = next(loader)
        inputs.to(device), targets.to(device)
        synchronize(device)
        if index:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def process_base_mb(imports: tuple[str, ...]) -> float:
    """Peak resident set of a fresh interpreter that imported `imports` (what a rank holds before its model:
    the framework itself, on CPU); cached per interpreter and import list."""
    key = {"imports": list(imports), "python": sys.version, "torch": torch.__version__,
           "device": f"cpu:{device_name(torch.device('cpu'))}", "batch": 0, "precision": "-", "threads": 1,
           "dataset": {"name": "process"}}
    # VmHWM, not ru_maxrss: the latter keeps the parent's peak across exec (this process's, after profiling).
    code = ("import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
            "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1])")

    def take() -> dict[str, Any]:
        result = subprocess.run([sys.executable, "-c", code, *imports], cwd=REPO_ROOT, capture_output=True,
                                text=True, check=True)
        return {"rss_mb": float(result.stdout.split()[-1]) / 1024}
    data, _ = _cached("process", key, take)
    return data["rss_mb"]
