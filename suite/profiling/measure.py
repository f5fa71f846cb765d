"""The child process of profiles: `python -m suite.profiling.measure WHAT[,WHAT] BATCH[,BATCH] DEVICE CONFIG` takes
them in a process of its own (forked by the fork server as a rank is: the threads a rank gets, none of the parent's
memory), in turn, and prints them as JSON; suite.profiling.cache starts it and stores what it prints."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from suite.data import build_datasets
from suite.models import build_model
from suite.models.layers import flatten_layers
from suite.profiling.cores import CoreWatch
from suite.profiling.profiles import DATA_BATCHES, MAX_STEPS, STEPS, WARMUP, LayerProfile, window_s
from suite.runtime.metrics import synchronize
from suite.runtime.model_transforms import compile_blocks, decoder_blocks
from suite.runtime.numerics import build_optimizer, make_precision
from suite.runtime.torch_api import set_math
from suite.strategies.pipeline import profile_sample
from suite.worker.trainer import loss_fn


def _status_bytes(field: str) -> int:
    """This process's VmRSS or VmHWM (peak resident set since it started), from /proc."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) * 1024


def _timed_steps(phases: list[Callable[[Any], Any]], device: torch.device, window: float = 0.0) -> list[list[float]]:
    """Each phase's seconds in each timed step: `STEPS` of them, or with a `window` (s) as many as take that long
    (at most `MAX_STEPS`). A step runs the phases in order, each given the previous one's result."""
    times: list[list[float]] = [[] for _ in phases]
    step = 0
    while step < WARMUP + STEPS or (sum(map(sum, times)) < window and step < WARMUP + MAX_STEPS):
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
    """Bytes of the distinct storages autograd saves for backward while active, parameters excluded; apart, those
    saved while one of the `watch`ed attention cores runs."""

    def __init__(self, params: set[int], watch: CoreWatch) -> None:
        self.params, self.watch, self.storages, self.in_core = params, watch, {}, {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.params:
            (self.in_core if self.watch.inside else self.storages)[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values()) + sum(n for ptr, n in self.in_core.items() if ptr not in self.storages)

    @property
    def core(self) -> int:
        """What the cores keep that nothing outside them does, their inputs excluded: what recomputing them frees."""
        inputs = {t.untyped_storage().data_ptr() for args in self.watch.inputs for t in args}
        return sum(n for ptr, n in self.in_core.items() if ptr not in self.storages and ptr not in inputs)


def _training_forward(cfg, batch: int, device: torch.device):
    """The point's model, precision and one batch, and its forward with the loss."""
    torch.manual_seed(cfg.seed)
    set_math(cfg.math.tf32, cfg.math.cudnn_benchmark)
    model = build_model(cfg.network, cfg.dataset).to(device).train()
    if cfg.get("compile", False):  # as the ranks run it: the warm-up steps compile
        compile_blocks(model, decoder_blocks(model), device)
    precision = make_precision(cfg.precision, device)
    inputs, targets = profile_sample(cfg, batch).to(device), _targets(cfg, batch).to(device)

    def forward(_) -> torch.Tensor:
        with precision.autocast():
            return loss_fn(model(inputs), targets)
    return model, precision, inputs, targets, forward


def _restart_peak() -> None:
    """VmHWM from here on: a forked child inherits its parent's (Linux's clear_refs "5", from 4.0; elsewhere the
    peak stays the process's own since it started)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _profile_network(cfg, batch: int, device: torch.device) -> dict[str, Any]:
    _restart_peak()
    before = _status_bytes("VmRSS")
    model, precision, inputs, targets, forward = _training_forward(cfg, batch, device)
    layers = flatten_layers(model)
    optimizer = build_optimizer(model.parameters(), cfg.optimizer)
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def step(_) -> None:
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    timed = _timed_steps([forward, precision.backward, step], device, window_s())
    forward_s, backward_s, optimizer_s = map(statistics.mean, timed)
    train_bytes = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                   else _status_bytes("VmHWM") - before)
    state_bytes = sum(_nbytes(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    raw = _profile_layers(layers, inputs, targets, precision, device, param_storages)
    fwd_scale = forward_s / max(sum(r["forward_s"] for r in raw), 1e-12)
    bwd_scale = backward_s / max(sum(r["backward_s"] for r in raw), 1e-12)
    for r in raw:
        r["forward_s"] *= fwd_scale
        r["core_forward_s"] *= fwd_scale
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

            with CoreWatch(layer.module) as watch:
                saved = _SavedBytes(param_storages, watch)
                with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
                    y = forward(None)
            grad = torch.ones_like(y) if last else torch.randn_like(y)
            timed = _timed_steps([forward, lambda out, grad=grad: out.backward(grad)], device)
            forward_s, backward_s = map(statistics.median, timed)
            core_s, core_flops = _time_cores(watch.cores, watch.inputs, precision, device)
            with FlopCounterMode(display=False) as fwd_count:
                y_counted = forward(None)
            with FlopCounterMode(display=False) as bwd_count:
                y_counted.backward(grad)
            layer.module.zero_grad(set_to_none=True)
            out.append(asdict(LayerProfile(
                name=layer.prefix.removesuffix(".") or type(layer.module).__name__, forward_s=forward_s,
                backward_s=backward_s, forward_flops=fwd_count.get_total_flops(),
                backward_flops=bwd_count.get_total_flops(), output_bytes=_nbytes(y), output_elements=y.numel(),
                saved_bytes=saved.total,
                param_bytes=sum(_nbytes(p) for p in params), param_tensors=len(params),
                tied_bytes=sum(_nbytes(p) for p in tied),
                block=bool(layer.prefix) and any(True for _ in layer.module.parameters()),
                core_forward_s=core_s, core_forward_flops=core_flops, core_saved_bytes=saved.core)))
            x = y.detach()
    finally:
        for module in in_place:
            module.inplace = True
    return out


def _time_cores(cores: list[nn.Module], inputs: list[tuple[torch.Tensor, ...]], precision,
                device: torch.device) -> tuple[float, int]:
    """The forward seconds (median of `STEPS`) and FLOPs of each attention core alone on the inputs it had in the
    layer, summed over the layer's cores."""
    seconds, flops = 0.0, 0
    for core, args in zip(cores, inputs):
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in args]

        def forward(_, core=core, leaves=leaves) -> torch.Tensor:
            with precision.autocast():
                return core(*leaves)
        seconds += statistics.median(_timed_steps([forward], device)[0])
        with FlopCounterMode(display=False) as counted:
            forward(None)
        flops += counted.get_total_flops()
    return seconds, flops


def _time_worker_forward(cfg, batch: int, device: torch.device) -> dict[str, Any]:
    """Training steps with the forward on the caller, then with the forward on one long-lived worker thread."""
    model, precision, _, _, forward = _training_forward(cfg, batch, device)

    def backward(loss: torch.Tensor) -> None:
        precision.backward(loss)
        model.zero_grad(set_to_none=True)

    caller = _timed_steps([forward, backward], device, window_s())
    with ThreadPoolExecutor(1) as worker:
        in_worker = _timed_steps([lambda _: worker.submit(forward, None).result(), backward], device, window_s())
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


def main(argv: list[str]) -> int:
    """`python -m suite.profiling.measure WHAT[,WHAT] BATCH[,BATCH] DEVICE CONFIG` (each WHAT network, data or
    thread, at its BATCH; CONFIG the point's resolved config, a yaml file): the profiles, in turn, as one JSON object
    by WHAT on stdout (what `network_profile`, `data_profile` and `worker_thread_profile` run in fresh
    interpreters)."""
    device, cfg = torch.device(argv[2]), OmegaConf.load(argv[3])
    takes = {"network": lambda batch: _profile_network(cfg, batch, device),
             "data": lambda batch: {"batch_s": _time_data(cfg, batch, device)},
             "thread": lambda batch: _time_worker_forward(cfg, batch, device)}
    whats, batches = argv[0].split(","), [int(b) for b in argv[1].split(",")]
    print(json.dumps({what: takes[what](batch) for what, batch in zip(whats, batches, strict=True)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
