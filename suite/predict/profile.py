"""Profiling a network on one device, layer by layer, as the performance model needs it; cached on disk.

A profile is taken at one batch (a rank's batch, or a pipeline's micro-batch), precision, optimizer and
thread count on this machine's device: `WARMUP` untimed training steps, then timed ones. The whole network
is timed over at least `WINDOW_S` seconds of steps (at least `STEPS`, at most `MAX_STEPS`), each phase's time
their mean: a training run's epoch averages over the swings of a machine's speed (a shared VM's doubles and
halves within seconds), and so must its profile, which a few steps would catch in one swing. Each layer alone
is timed over `STEPS` steps, their median. It holds, per layer of `suite.models.layers` (the unit a
pipeline cuts between; the last one includes the loss): forward and backward seconds, forward and backward
FLOPs (torch's FlopCounterMode, 2 per multiply-add), the bytes of its output (what a stage boundary after
it sends, and the gradient that comes back), the bytes autograd keeps for its backward, and its parameters'
bytes and count (a tied weight counted in its first layer, and as tied in the others). Layers are timed one
at a time on the previous layer's output, which costs a little more than the same layers inside the whole
network, so their times are scaled to add up to the whole network's forward and backward, timed in the same
steps as its optimizer step; their sum is Study J's sequential measurement of a training step. Loading a batch
is profiled apart (`data_profile`), at the batch a rank reads, which a pipeline's micro-batch is not. So is the
forward on a worker thread (`worker_thread_profile`), where torchgpipe runs it.

Profiles are JSON files under `results/profiles/`, named by what they were taken on and a digest of the
rest, so a sweep or a recommendation profiles each (network, data shape, batch, precision, optimizer,
device, threads) once.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from suite.data import build_datasets
from suite.errors import ConfigError
from suite.models import build_model
from suite.models.layers import flatten_layers
from suite.paths import REPO_ROOT, results_dir
from suite.records.point_dir import error_line
from suite.runtime.gpu_query import first_gpu
from suite.runtime.optim import build_optimizer
from suite.runtime.precision import make_precision
from suite.runtime.timing import synchronize
from suite.strategies import missing_library
from suite.strategies.pipeline import profile_sample
from suite.worker.trainer import loss_fn

VERSION = 6  # of what a profile holds: a profile of another version is taken again
WARMUP = 2  # untimed steps first (allocator, caches, lazy initialisation)
STEPS = 5  # timed steps at least
WINDOW_S = 5.0  # of the whole network's timed steps, unless MAX_STEPS come first
MAX_STEPS = 200  # a step of a tiny network takes milliseconds: 50 of them caught one swing of this VM's speed
DATA_BATCHES = 5  # batches loaded to time the data phase (after one untimed)
# A point whose network is negligible: what its rank holds is the framework's (see `rank_base_mb`).
NEGLIGIBLE = ["dataset=tokens", "network=gpt2_tiny", "network.n_layer=1", "network.n_head=1", "network.n_embd=8",
              "dataset.vocab_size=16", "dataset.seq_len=4", "dataset.samples=8", "dataset.val_samples=2",
              "batch_size=2", "epochs=1", "steps_per_epoch=1", "warmup_steps=1", "eval_batches=1",
              "optimizer.name=adam", "workers=1", "cluster=local"]

T = TypeVar("T")  # what a cached profile is read as


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
    param_tensors: int  # how many they are (what per-parameter hooks and messages scale with)
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
    train_bytes: int  # what training the whole network added to the process at its peak (all of the above, and
    # the allocator's and the kernels' workspace): peak resident set growth on CPU, peak allocation on GPU
    buffer_bytes: int  # BatchNorm statistics and the like
    warmup: int = WARMUP
    steps: int = STEPS  # of the whole network, timed

    @property
    def batch(self) -> int:
        return self.key["batch"]

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    @property
    def param_tensors(self) -> int:
        return sum(layer.param_tensors for layer in self.layers)

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


@dataclass(frozen=True)
class WorkerThreadProfile:
    """The network's training forward on the calling thread, and on a worker thread that takes turns with it, as
    torchgpipe's worker runs every forward and the caller runs backward. On CPU the worker's OpenMP team competes
    for the cores with the caller's, which spins a while after each of its parallel regions."""

    key: dict[str, Any]
    forward_s: float
    worker_forward_s: float

    @property
    def slowdown(self) -> float:
        return self.worker_forward_s / self.forward_s

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerThreadProfile:
        return cls(**data)


def device_name(device: torch.device) -> str:
    """The model of this machine's device of `device`'s type, asked without a CUDA context (`first_gpu`: the GPU
    that profiles run on)."""
    if device.type == "cuda":
        return first_gpu().name
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.machine()


def _key(cfg, batch: int, device: torch.device, threads: int, parts: tuple[str, ...]) -> dict[str, Any]:
    key = {part: OmegaConf.to_container(cfg[part], resolve=True) for part in parts}
    # How many samples there are, and where they are read from, changes neither shape nor cost of a batch.
    key["dataset"] = {k: v for k, v in key["dataset"].items() if k not in ("path", "samples", "val_samples")}
    return {**key, "batch": batch, "precision": cfg.precision, "device": f"{device.type}:{device_name(device)}",
            "threads": threads, "torch": torch.__version__, "version": VERSION}


def _cached(kind: str, key: dict[str, Any], take: Callable[[], dict[str, Any]],
            parse: Callable[[dict[str, Any]], T]) -> tuple[T, bool]:
    """The profile of `key` (`parse`d) from results/profiles/, or taken now and stored; and whether it was stored
    before. A stored file that does not parse (cut short by a full disk or a killed process, edited) is said on
    stderr, discarded and taken again."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    name = key.get("network", {}).get("name") or key["dataset"]["name"]
    stem = f"{kind}-{name}-b{key['batch']}-{key['precision']}-t{key['threads']}-{digest}"
    path = results_dir() / "profiles" / f"{stem}.json"
    if path.exists():
        try:
            return parse(json.loads(path.read_text())), True
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # not JSON, or not a profile of this version
            print(f"warning: profile cache {path} is damaged ({error_line(e)}): discarded, profiling again",
                  file=sys.stderr, flush=True)
            path.unlink(missing_ok=True)
    data = {"key": key, **take()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return parse(data), False


def network_profile(cfg, batch: int, device: torch.device, threads: int, together: int = 1) -> tuple[Profile, bool]:
    """The profile of the point's network at `batch` (and whether it came from the cache), taken by `together`
    processes at once (see `_in_children`)."""
    key = {**_key(cfg, batch, device, threads, ("network", "dataset", "optimizer")), "together": together}
    return _cached("net", key, lambda: _in_children("network", cfg, batch, device, threads, together),
                   Profile.from_json)


def data_profile(cfg, batch: int, device: torch.device, threads: int, together: int = 1) -> tuple[DataProfile, bool]:
    key = {**_key(cfg, batch, device, threads, ("dataset",)), "together": together}
    return _cached("data", key, lambda: _in_children("data", cfg, batch, device, threads, together),
                   DataProfile.from_json)


def worker_thread_profile(cfg, batch: int, device: torch.device, threads: int,
                          together: int = 1) -> tuple[WorkerThreadProfile, bool]:
    key = {**_key(cfg, batch, device, threads, ("network", "dataset")), "together": together}  # no optimizer step
    return _cached("thread", key, lambda: _in_children("thread", cfg, batch, device, threads, together),
                   WorkerThreadProfile.from_json)


def _in_children(what: str, cfg, batch: int, device: torch.device, threads: int, together: int) -> dict[str, Any]:
    """Profile in `together` fresh interpreters at once, each with the threads a rank gets (OMP_NUM_THREADS, read
    when torch loads): as many as the point's ranks that share this node's cores, so that what they take from each
    other (cores, caches, memory bandwidth) is in the times, and neither this process's threads nor its memory
    are. Each time is the median over the children; the rest is the first child's."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
        config.write(OmegaConf.to_yaml(cfg, resolve=True))
        config.flush()
        command = [sys.executable, "-m", "suite.predict.profile", what, str(batch), str(device), config.name]
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO_ROOT,
                                     text=True) for _ in range(together)]
        ended = [child.communicate() for child in children]
    results = []
    for child, (out, err) in zip(children, ended):
        if child.returncode:
            lines = [line for line in err.splitlines() if line.strip()]
            raise ConfigError(f"profiling {cfg.network.name} at batch {batch} failed: {lines[-1] if lines else '?'}")
        results.append(json.loads(out.splitlines()[-1]))
    return _median_times(results)


def _median_times(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The first result, each of its times (`*_s`, also per layer) the median over all results."""
    first = dict(results[0])
    for name in (k for k in first if k.endswith("_s")):
        first[name] = statistics.median(r[name] for r in results)
    if "layers" in first:
        first["layers"] = [{**layer, **{k: statistics.median(r["layers"][i][k] for r in results)
                                        for k in layer if k.endswith("_s")}}
                           for i, layer in enumerate(first["layers"])]
    return first


def _status_bytes(field: str) -> int:
    """This process's VmRSS or VmHWM (peak resident set since it started), from /proc."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) * 1024


def _timed_steps(phases: list[Callable[[Any], Any]], device: torch.device, window_s: float = 0.0) -> list[list[float]]:
    """Each phase's seconds in each timed step: `STEPS` of them, or with a `window_s` as many as take that long
    (at most `MAX_STEPS`). A step runs the phases in order, each given the previous one's result."""
    times: list[list[float]] = [[] for _ in phases]
    step = 0
    while step < WARMUP + STEPS or (sum(map(sum, times)) < window_s and step < WARMUP + MAX_STEPS):
        result = None
        for phase, phase_times in zip(phases, times):
            synchronize(device)
            start = time.perf_counter()
            result = phase(result)
            synchronize(device)
            if step >= WARMUP:
                phase_times.append(time.perf_counter() - start)
        step += 1
    return times


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


def _training_forward(cfg, batch: int, device: torch.device):
    """The point's model, precision and one batch, and its forward with the loss."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.network, cfg.dataset).to(device).train()
    precision = make_precision(cfg.precision, device)
    inputs, targets = profile_sample(cfg, batch).to(device), _targets(cfg, batch).to(device)

    def forward(_) -> torch.Tensor:
        with precision.autocast():
            return loss_fn(model(inputs), targets)
    return model, precision, inputs, targets, forward


def _profile_network(cfg, batch: int, device: torch.device) -> dict[str, Any]:
    before = _status_bytes("VmRSS")
    model, precision, inputs, targets, forward = _training_forward(cfg, batch, device)
    layers = flatten_layers(model)
    optimizer = build_optimizer(model.parameters(), cfg.optimizer)
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def step(_) -> None:
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    timed = _timed_steps([forward, precision.backward, step], device, WINDOW_S)
    forward_s, backward_s, optimizer_s = map(statistics.mean, timed)
    train_bytes = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                   else _status_bytes("VmHWM") - before)
    state_bytes = sum(_nbytes(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    raw = _profile_layers(layers, inputs, targets, precision, device, param_storages)
    fwd_scale = forward_s / max(sum(r["forward_s"] for r in raw), 1e-12)
    bwd_scale = backward_s / max(sum(r["backward_s"] for r in raw), 1e-12)
    for r in raw:
        r["forward_s"] *= fwd_scale
        r["backward_s"] *= bwd_scale
    return {"layers": raw, "input_bytes": _nbytes(inputs), "forward_s": forward_s, "backward_s": backward_s,
            "optimizer_s": optimizer_s, "optimizer_state_bytes": state_bytes, "train_bytes": train_bytes,
            "buffer_bytes": sum(_nbytes(b) for b in model.buffers()), "steps": len(timed[0])}


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
            timed = _timed_steps([forward, lambda out, grad=grad: out.backward(grad)], device)
            forward_s, backward_s = map(statistics.median, timed)
            with FlopCounterMode(display=False) as fwd_count:
                y_counted = forward(None)
            with FlopCounterMode(display=False) as bwd_count:
                y_counted.backward(grad)
            layer.module.zero_grad(set_to_none=True)
            out.append(asdict(LayerProfile(
                name=layer.prefix.removesuffix(".") or type(layer.module).__name__, forward_s=forward_s,
                backward_s=backward_s, forward_flops=fwd_count.get_total_flops(),
                backward_flops=bwd_count.get_total_flops(), output_bytes=_nbytes(y), saved_bytes=saved.total,
                param_bytes=sum(_nbytes(p) for p in params), param_tensors=len(params),
                tied_bytes=sum(_nbytes(p) for p in tied),
                block=bool(layer.prefix) and any(True for _ in layer.module.parameters()))))
            x = y.detach()
    finally:
        for module in in_place:
            module.inplace = True
    return out


def _time_worker_forward(cfg, batch: int, device: torch.device) -> dict[str, Any]:
    """Training steps with the forward on the caller, then with the forward on one long-lived worker thread."""
    model, precision, _, _, forward = _training_forward(cfg, batch, device)

    def backward(loss: torch.Tensor) -> None:
        precision.backward(loss)
        model.zero_grad(set_to_none=True)

    caller = _timed_steps([forward, backward], device, WINDOW_S)
    with ThreadPoolExecutor(1) as worker:
        in_worker = _timed_steps([lambda _: worker.submit(forward, None).result(), backward], device, WINDOW_S)
    return {"forward_s": statistics.mean(caller[0]), "worker_forward_s": statistics.mean(in_worker[0])}


def _time_data(cfg, batch: int, device: torch.device) -> float:
    """Loading one batch as the trainer does (its DataLoader settings), the loader started again when the data
    runs out. With loader processes, their steady rate: the first batch of each process arrives nearly at once,
    after one batch's work, so the time is taken over whole rounds of one batch per process after it."""
    data = build_datasets(cfg.dataset, cfg.seed)
    workers = cfg.dataset.loader_workers
    loader = DataLoader(data.train, batch, shuffle=True, drop_last=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(cfg.seed))
    per_lap = max(workers, 1)
    laps = -(-DATA_BATCHES // per_lap)
    batches = iter(())
    times = []
    for lap in range(laps + 1):
        start = time.perf_counter()
        for _ in range(per_lap if lap else 1):
            try:
                inputs, targets = next(batches)
            except StopIteration:
                batches = iter(loader)
                inputs, targets = next(batches)
            inputs.to(device), targets.to(device)
            synchronize(device)
        if lap:
            times.append((time.perf_counter() - start) / per_lap)
    return statistics.median(times)


def rank_base_mb(strategy: str, threads: int) -> float:
    """Peak memory of a rank of `strategy` training a negligible network (a one-block GPT-2 of width 8), one step
    on one worker, started here as a sweep starts its ranks: what the framework, its libraries and the rank's
    own machinery hold before a model (on CPU the resident set, on GPU the CUDA context and allocator)."""
    from launchers import launch
    from suite.sweep.plan import plan
    from suite.sweep.point import new_point_dir

    key = {"strategy": strategy, "threads": threads, "device": f"{'cuda' if torch.cuda.is_available() else 'cpu'}:"
           f"{device_name(torch.device('cuda' if torch.cuda.is_available() else 'cpu'))}", "torch": torch.__version__,
           "python": sys.version, "batch": 0, "precision": "fp32", "dataset": {"name": "rank"}, "version": VERSION}

    def take() -> dict[str, Any]:
        (point,) = plan([[*NEGLIGIBLE, f"strategy={strategy}", f"cluster.threads_per_worker={threads}"]],
                        experiment="rank-base")
        missing = missing_library(point.strategy)
        if missing:
            raise ConfigError(missing)
        out = new_point_dir(point)
        try:
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                   "SUITE_POINT_LABEL": f"[base memory of a {strategy} rank]"}
            launch("local", out.path, point.processes, point.cfg.timeout_s, env, point.rank_launcher)
            summary = out.summary()
            if not summary:
                raise ConfigError(f"a one-step {strategy} rank with a negligible network did not finish here, so its "
                                  f"base memory is unknown: see {out.path}")
            return {"peak_mb": summary["peak_memory_mb"]}
        finally:
            if out.summary():
                shutil.rmtree(out.path, ignore_errors=True)
    peak_mb, _ = _cached("base", key, take, lambda data: float(data["peak_mb"]))
    return peak_mb


def main(argv: list[str]) -> int:
    """`python -m suite.predict.profile network|data|thread BATCH DEVICE CONFIG` (the point's resolved config, a
    yaml file): one profile as JSON on stdout (what `network_profile`, `data_profile` and `worker_thread_profile`
    run in fresh interpreters)."""
    what, batch, device = argv[0], int(argv[1]), torch.device(argv[2])
    cfg = OmegaConf.load(argv[3])
    takes = {"network": lambda: _profile_network(cfg, batch, device),
             "data": lambda: {"batch_s": _time_data(cfg, batch, device)},
             "thread": lambda: _time_worker_forward(cfg, batch, device)}
    result = takes[what]()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
