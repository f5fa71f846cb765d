"""What a training step measures, for the trainer to report: the seconds of each phase, the bytes this rank sends
in collectives (`comm_mb_per_step`), the FLOPs of a step, and the share of the devices' peak they achieve (MFU, HFU);
and this rank's memory: its peak (CUDA allocator and NVML on GPU, peak resident set size on CPU) and the bytes held in
parameters, gradients and optimizer states (see Strategy.memory_split).
"""

from __future__ import annotations

import gc
import os
import re
import resource
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.distributed_c10d import _world

from suite.models import build_model
from suite.paths import DamagedRecord, load_record, reading, record_path
from suite.point_dir import error_line
from suite.runtime.model_transforms import apply_activation_checkpointing, recomputes
from suite.runtime.torch_api import convolution_tf32, is_dtensor, matmul_tf32
from suite.shared_names import DEVICE_MEMORY, MathDtype, PeakSource

try:
    from torch._C._distributed_c10d import PreHookArgs
except ImportError:  # process-group pre-hooks came with torch 2.14: an older torch (a GPU machine's own) counts none
    PreHookArgs = None

# Time by phase. On CPU a phase is timed with the host clock. On GPU it is timed with CUDA events on the current
# stream of each GPU the rank drives (a phase lasts as long as on the GPU where it lasts longest), read once per
# epoch after the epoch's final synchronisation, so timing a phase never stalls the host from queueing work ahead
# (the epoch clock stays that of an uninstrumented loop).

PHASES = ("data", "forward", "backward", "optimizer")


def synchronize(*devices: torch.device) -> None:
    """Wait for the work queued on `devices` so that a clock read covers it (a no-op on CPU)."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class PhaseTimer:
    """Accumulates seconds per phase over the steps taken while `enabled` (warm-up steps are not)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.devices = [device]  # where a phase's events are recorded: a runtime driving several GPUs names them
        self.enabled = False
        self.totals: dict[str, float] = defaultdict(float)
        self.pending: list[tuple[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]]] = []
        self.steps = 0
        # While a profiler records (suite.runtime.profile): a named range around each timed phase.
        self.ranges: Callable[[str], AbstractContextManager] | None = None

    @contextmanager
    def phase(self, *names: str) -> Iterator[None]:
        """Time the block under each of `names` (e.g. "forward" and the pipeline stage's own name); while a
        profiler records, the block is also a range named by the first."""
        if not self.enabled:
            yield
            return
        with self.ranges(names[0]) if self.ranges else nullcontext():
            if self.device.type == "cuda":
                streams = [torch.cuda.current_stream(device) for device in self.devices]
                events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in streams]
                for (start, _), stream in zip(events, streams):
                    start.record(stream)
                yield
                for (_, end), stream in zip(events, streams):
                    end.record(stream)
                self.pending += [(name, events) for name in names]
            else:
                start_s = time.perf_counter()
                yield
                self.add(time.perf_counter() - start_s, *names)

    def add(self, seconds: float, *names: str) -> None:
        """Count host-clock seconds measured around work that `phase` cannot enclose (module hooks)."""
        if self.enabled:
            for name in names:
                self.totals[name] += seconds

    def collect(self) -> None:
        """Fold the recorded CUDA events into the totals; call after synchronising the devices."""
        for name, events in self.pending:
            self.totals[name] += max(start.elapsed_time(end) for start, end in events) / 1000
        self.pending.clear()

    def means(self) -> dict[str, float]:
        """Mean seconds per timed step for each phase that was timed."""
        return {p: self.totals[p] / self.steps for p in PHASES if p in self.totals and self.steps}


# Bytes sent (`comm_mb_per_step`): the bytes this rank sends in collectives. Every process group calls a pre-hook for
# each collective, whoever issues it (DDP's reducer and its communication hooks, FSDP2, DTensor, DeepSpeed), with the
# tensors it is handed; the hook counts them while a training step runs. A collective of N bytes (the whole buffer:
# for an all-gather its output, for a reduce-scatter its input) among p ranks counts what each rank sends with
# bandwidth-optimal (ring) algorithms, the factors of NCCL's bus bandwidth: all-reduce 2N(p-1)/p, all-gather,
# reduce-scatter and all-to-all N(p-1)/p, broadcast and send N, reduce N except on its root (in a chain every rank
# but the root forwards a partial sum; reductions to different roots add up to a reduce-scatter). Receives and
# barriers send nothing; a group of one rank sends nothing. With two ranks, an all-reduce of the gradients counts
# their size once.

HOOK_ID = 0x5C0C  # one pre-hook of ours per process group
# Share of the buffer one rank sends, given the group's size and whether this rank is the collective's root; by
# the name of torch's HookOpName.
SHARE_SENT = {
    "ALLREDUCE": lambda p, root: 2 * (p - 1) / p,
    "ALLGATHER": lambda p, root: (p - 1) / p,
    "REDUCE_SCATTER": lambda p, root: (p - 1) / p,
    "ALLTOALL": lambda p, root: (p - 1) / p,
    "BROADCAST": lambda p, root: 1.0,
    "REDUCE": lambda p, root: 0.0 if root else 1.0,
    "SEND": lambda p, root: 1.0,
}


def buffer_bytes(args) -> int:
    return max(sum(t.numel() * t.element_size() for t in tensors)
               for tensors in (args.input_tensors, args.output_tensors))


class CommVolume:
    """Bytes sent in the collectives of every process group that exists when it is created; nothing is
    counted when not `enabled` (a strategy that also communicates outside torch.distributed), nor by a torch
    without process-group hooks (`counts` false)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.counts = enabled and PreHookArgs is not None
        self.counting = False
        self.sent_bytes = 0.0
        for group in list(_world.pg_map) if self.counts else []:  # torch lists its process groups only there
            if group.size() > 1:
                group.register_pre_hook(HOOK_ID, self._hook(group.size(), group.rank()))

    def _hook(self, ranks: int, rank: int):
        def count(args) -> None:
            if self.counting and args.name.name in SHARE_SENT:
                self.sent_bytes += SHARE_SENT[args.name.name](ranks, args.root == rank) * buffer_bytes(args)
        return count

    @contextmanager
    def counted(self, timed: bool) -> Iterator[None]:
        """Count the collectives issued inside the block if it is part of a timed step."""
        self.counting = timed
        try:
            yield
        finally:
            self.counting = False


# FLOPs: the model FLOPs of one training step, counted by torch's FlopCounterMode: 2 FLOPs per multiply-add, matrix
# products, convolutions and attention, forward and backward (elementwise operations, normalisation, the loss and
# the optimizer are not counted). The count runs once per point, on the meta device: a copy of the network built
# there computes no numbers, so counting costs a fraction of a second at any batch and touches neither the real
# model nor the timed steps. It is taken at one replica's mini-batch. The recomputation of activation checkpointing
# is counted apart, by counting the copy again with the point's blocks (or attention cores) checkpointed: MFU divides
# model FLOPs (none recomputed), HFU the FLOPs the devices compute. Attention is counted as the math kernel's two
# batched products over the whole (uncausal) score matrix, whatever kernel the device runs.

META = torch.device("meta")


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                       _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's backward: each gradient asked for (input, weight) takes as many multiply-adds as the
    forward, where each output element (of a transposed convolution: each input element) meets
    prod(w_shape[1:]) weights. torch 2.14's own formula counts the weight gradient of a grouped convolution as
    if every input channel met every output channel, a depthwise convolution's channels times over (the fix is
    pytorch/pytorch#183405); counted so, MobileNetV2's backward was 20 times its forward."""
    return sum(output_mask[:2]) * 2 * prod(x_shape if transposed else grad_out_shape) * prod(w_shape[1:])


FORMULAS = {torch.ops.aten.convolution_backward: conv_backward_flop}  # over torch's own


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step of one replica."""

    forward: int
    model: int  # forward and backward, no recomputation
    hardware: int  # what the devices compute: `model` plus the forward passes computed again in backward


def count_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[int, int]:
    """FLOPs of the forward pass and of forward and backward together, of one step of `model` on this batch."""
    from torch.utils.flop_counter import FlopCounterMode  # here: it imports triton (0.4 s), which the driver needs not

    with FlopCounterMode(display=False, custom_mapping=FORMULAS) as counter:
        loss = loss_fn(model(inputs), targets)
        forward = counter.get_total_flops()
        loss.backward()
    return forward, counter.get_total_flops()


def meta_batch(sample: tuple[torch.Tensor, torch.Tensor], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch shaped like `batch` items such as `sample` (inputs, target), on the meta device."""
    return tuple(torch.empty((batch, *torch.as_tensor(t).shape), dtype=torch.as_tensor(t).dtype, device=META)
                 for t in sample)


def step_flops(network, dataset, sample: tuple[torch.Tensor, torch.Tensor], batch: int, checkpointing: str,
               recomputed_share: float, loss_fn) -> StepFlops:
    """FLOPs of one step of the point's network on `batch` items like `sample`. `checkpointing`: the
    point's `activation_checkpointing` (see suite.runtime.model_transforms); `recomputed_share`:
    the share of the forward pass a strategy's own recomputation runs again (torchgpipe's checkpoint)."""
    inputs, targets = meta_batch(sample, batch)
    with META:
        plain = build_model(network, dataset)
    forward, model = count_step(plain, inputs, targets, loss_fn)
    hardware = model
    if recomputes(checkpointing):
        with META:
            checkpointed = build_model(network, dataset)
        apply_activation_checkpointing(checkpointed, checkpointing, None)
        _, hardware = count_step(checkpointed, inputs, targets, loss_fn)
    return StepFlops(forward, model, round(hardware + recomputed_share * forward))


# Utilisation: how much of its devices' peak a point used, MFU (model FLOPs) and HFU (hardware FLOPs, recomputation
# included), as PaLM defines them, and the peak they divide by. A point's FLOPs are counted once (step_flops) at one
# replica's mini-batch; a global step is `dp` of those. The rate is per device: on GPU a rank's GPU (torchgpipe's
# process drives `pp` of them); on CPU a node, whose cores its ranks share. The peak is that device's dense matmul
# rate for the math dtype the point computes in, taken, in this order, from:
# 1. the calibration record of the cluster (`make calibrate`, results/calibration/<cluster>.yaml), if it was
#    measured on the same device (a CPU with as many threads as the point's ranks on a node use);
# 2. the cluster config's `hardware.peak_tflops` (the vendor's datasheet).
# There is no default: without either, the run has no `mfu`, and its `suite.mfu_missing` tag says why.

TFLOP = 1e12


@dataclass(frozen=True)
class Device:
    """One device as MFU sees it: its name, and on CPU the threads the point's ranks on a node use."""

    name: str
    threads: int | None = None  # None on GPU

    def describe(self) -> str:
        return f"{self.name} with {self.threads} threads" if self.threads else self.name


@dataclass(frozen=True)
class Peak:
    tflops: float
    dtype: str
    source: PeakSource
    detail: str  # where exactly the number comes from


@dataclass(frozen=True)
class NoPeak:
    reason: str


def math_dtype(precision: str, device: torch.device, convolutional: bool) -> str:
    """The dtype a point's matrix products run in: its precision, except fp32 on GPUs with tensor cores for
    TF32 (compute capability 8.0+), where torch lets cuDNN run convolutions in TF32 by default, and matrix
    products where TF32 is allowed (`torch.set_float32_matmul_precision`, or newer torch's
    `torch.backends.cuda.matmul.fp32_precision`)."""
    if precision != MathDtype.fp32 or device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 0):
        return precision
    tf32 = convolution_tf32() if convolutional else matmul_tf32()
    return MathDtype.tf32 if tf32 else MathDtype.fp32


def calibrated_peak(cluster: str, dtype: str, device: Device) -> Peak | NoPeak:
    """The peak the cluster's calibration record measured on `device`; none, and why, where it has none (a damaged
    record included: a rank goes on without MFU)."""
    path = record_path(cluster)
    try:
        with reading(path):
            return _recorded_peak(load_record(cluster), path, dtype, device)
    except DamagedRecord as e:
        return NoPeak(str(e))


def _recorded_peak(record: dict | None, path: Path, dtype: str, device: Device) -> Peak | NoPeak:
    if record is None:
        return NoPeak(f"no calibration record {path} (make calibrate CLUSTER={path.stem})")
    measured, matmul = record.get("provenance", {}), record.get("matmul")
    if not matmul or "device" not in measured:
        return NoPeak(f"the calibration record {path} has no matmul measured on a named device")
    calibrated = Device(measured["device"], matmul.get("threads"))
    if calibrated != device:
        return NoPeak(f"the calibration record {path} measured {calibrated.describe()}, this point runs on "
                      f"{device.describe()}")
    if dtype not in matmul["tflops"]:
        return NoPeak(f"the calibration record {path} has no {dtype} matmul")
    return Peak(matmul["tflops"][dtype], dtype, PeakSource.calibration,
                f"{path}: {dtype} matmul n={matmul['n']} measured {measured['date']} on {measured['hosts'][0]}")


def find_peak(cluster, dtype: str, device: Device) -> Peak | NoPeak:
    """The peak of one device for `dtype`: measured by a calibration of the cluster, else the vendor's."""
    calibrated = calibrated_peak(cluster.name, dtype, device)
    if isinstance(calibrated, Peak):
        return calibrated
    vendor = (cluster.hardware.peak_tflops or {}).get(dtype)
    if vendor is not None:
        return Peak(vendor, dtype, PeakSource.vendor, f"conf/cluster/{cluster.name}.yaml hardware.peak_tflops.{dtype} "
                                                      f"({calibrated.reason})")
    return NoPeak(f"{calibrated.reason}; cluster {cluster.name} gives no hardware.peak_tflops.{dtype}")


def utilisation(flops: StepFlops, dp: int, steps: int, seconds: float, devices: int,
                peak: Peak | NoPeak) -> tuple[dict[str, float], dict[str, str]]:
    """Summary metrics and run tags of `steps` global steps of `dp` replicas in `seconds` on `devices`."""
    step_tflop = flops.model * dp / TFLOP
    hardware_tflop = flops.hardware * dp / TFLOP
    achieved = step_tflop * steps / seconds / devices
    metrics = {"model_tflop_per_step": step_tflop, "hardware_tflop_per_step": hardware_tflop,
               "achieved_tflops": achieved}
    if isinstance(peak, NoPeak):
        return metrics, {"suite.mfu_missing": peak.reason}
    metrics.update(peak_tflops=peak.tflops, mfu=achieved / peak.tflops,
                   hfu=hardware_tflop * steps / seconds / devices / peak.tflops)
    return metrics, {"suite.peak_source": peak.source, "suite.peak_dtype": peak.dtype,
                     "suite.peak_detail": peak.detail}


def _status_bytes(field: str) -> int:
    """A size from /proc/self/status (Linux reports kB)."""
    with open("/proc/self/status") as status:
        return 1024 * int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


def limit_cpu_memory(limit_bytes: float) -> None:
    """Hold this process to `limit_bytes` of resident memory, as a GPU's size holds a rank: an allocation past it
    fails (torch: "can't allocate memory"), and the point is recorded as out of memory. The kernel limits the
    data segment (RLIMIT_DATA: the heap and private writable mappings, where tensors live), which also counts
    what is reserved but not yet resident (thread stacks, malloc arenas), so the limit is the data segment now
    plus what is left of `limit_bytes` beside the resident set now. The intra-op threads are started first, so
    that their stacks (reserved, barely resident) are in the data segment the limit starts from."""
    torch.ones(2**16).sum()  # a parallel op: the thread pool starts at the first
    resident, data = _status_bytes("VmRSS"), _status_bytes("VmData")
    if resident >= limit_bytes:
        raise MemoryError(f"out of memory: this rank holds {resident / 2**20:.0f} MiB before training, more than "
                          f"the {limit_bytes / 2**20:.0f} MiB it may use (cluster.hardware.device_memory_gb)")
    ceiling = int(data + limit_bytes - resident)
    resource.setrlimit(resource.RLIMIT_DATA, (ceiling, ceiling))


def free_cached_memory(*devices: torch.device) -> None:
    """Give the memory the CUDA allocator caches on every GPU of this process back to the driver (a no-op unless
    one of `devices` is a GPU). Garbage is collected first: a tensor that only a reference cycle still holds keeps
    its block until then."""
    if any(device.type == "cuda" for device in devices):
        gc.collect()
        torch.cuda.empty_cache()


def reset_peak(*devices: torch.device) -> None:
    """Start the peaks that `peak_memory` reports, on every device the rank drives. The cache left from setup is
    freed first (FSDP2 and ZeRO move the whole model to the GPU before sharding it; `by_time` balancing profiles
    layer copies): a reset restarts the reserved peak at what is reserved now, cache included, and NVML counts
    the cache as the process's, so both would start near the unsharded model's size."""
    free_cached_memory(*devices)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)


def nvml_uuid(cuda_uuid: str) -> str:
    """NVML's name for the GPU that CUDA calls `cuda_uuid` (torch's form: the bare 8-4-4-4-12 hex digits; NVML's:
    the same after "GPU-"). NVML numbers GPUs its own way, blind to CUDA_VISIBLE_DEVICES (a rank bound to one GPU
    sees it as cuda:0), so a GPU is looked up by its UUID, never by the CUDA index."""
    return cuda_uuid if cuda_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{cuda_uuid}"


# Why NVML gave no number of this process's own (then `nvml_used_mb` is the whole GPU's, or missing).
NVML_PER_PROCESS_MISSING = "nvml_per_process_missing"


@dataclass(frozen=True)
class GpuView:
    """What NVML shows of one GPU: the processes computing on it (each with `pid` and `usedGpuMemory`, in bytes or
    None where NVML cannot tell) and the memory used on the whole GPU."""

    processes: list
    used_bytes: int
    split_by_mig: bool = False  # a whole GPU split into MIG instances: its used memory is every instance's


def nvml_numbers(view: GpuView | str, pid: int, ranks_share_gpu: bool) -> dict[str, float | str]:
    """`nvml_used_mb`: what NVML sees process `pid` hold on the GPU of `view` (a str: why NVML could not be read).
    NVML finds a process by its pid, which fails in a container without the host's PID namespace (NVML lists host
    pids), and gives no per-process memory under MIG; then, if the process is alone on the GPU, the GPU's used
    memory is its own. `nvml_per_process_missing` says why the per-process number is missing."""
    if isinstance(view, str):
        return {NVML_PER_PROCESS_MISSING: view}
    mine = [p for p in view.processes if p.pid == pid]
    if mine and mine[0].usedGpuMemory is not None:
        return {"nvml_used_mb": mine[0].usedGpuMemory / 2**20}
    why = ("NVML lists this process without its memory (MIG)" if mine else
           f"this process (pid {pid}) is not among the {len(view.processes)} NVML lists on the GPU "
           "(a container without the host's PID namespace)")
    if ranks_share_gpu:
        return {NVML_PER_PROCESS_MISSING: f"{why}; the job's ranks share GPUs (cluster.share_gpus)"}
    if view.split_by_mig:
        return {NVML_PER_PROCESS_MISSING: f"{why}; NVML sees the whole GPU, split into MIG instances"}
    if len(view.processes) > 1:
        return {NVML_PER_PROCESS_MISSING: f"{why}; {len(view.processes)} processes use the GPU"}
    return {"nvml_used_mb": view.used_bytes / 2**20,
            NVML_PER_PROCESS_MISSING: f"{why}; nvml_used_mb is the GPU's used memory, this process being alone on it"}


def _split_by_mig(pynvml, handle) -> bool:
    try:
        return (not pynvml.nvmlDeviceIsMigDeviceHandle(handle)
                and pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE)
    except pynvml.NVMLError:  # a GPU without MIG
        return False


def _gpu_view(device: torch.device) -> GpuView | str:
    """NVML's view of `device` (allocator cache, CUDA contexts, NCCL buffers), or why there is none."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(str(torch.cuda.get_device_properties(device).uuid)))
            return GpuView(pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
                           pynvml.nvmlDeviceGetMemoryInfo(handle).used, _split_by_mig(pynvml, handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # NVML missing, or no permission to list processes (containers)
        return f"NVML not readable: {error_line(e)}"


def _gpu_memory(device: torch.device, ranks_share_gpu: bool) -> dict[str, float | str]:
    numbers: dict[str, float | str] = {
        "peak_cuda_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
        "peak_cuda_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
        **nvml_numbers(_gpu_view(device), os.getpid(), ranks_share_gpu)}
    numbers["peak_memory_mb"] = max(numbers["peak_cuda_reserved_mb"], numbers.get("nvml_used_mb", 0.0))
    return numbers


def peak_memory(*devices: torch.device, ranks_share_gpu: bool = False) -> dict[str, Any]:
    """This rank's memory numbers in MiB; `peak_memory_mb` is the one a point reports. On GPUs, each number is the
    largest over `devices` (a gpipe process drives several), and `by_device` holds each device's own."""
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    gpus = list(dict.fromkeys(d for d in devices if d.type == "cuda"))
    if not gpus:
        return {"peak_rss_mb": rss_mb, "peak_memory_mb": rss_mb}
    by_device = {str(d): _gpu_memory(d, ranks_share_gpu) for d in gpus}
    numbers = {key: max(n[key] for n in by_device.values() if key in n)
               for key in ("peak_memory_mb", *DEVICE_MEMORY) if any(key in n for n in by_device.values())}
    missing = [f"{name}: {n[NVML_PER_PROCESS_MISSING]}" for name, n in by_device.items()
               if NVML_PER_PROCESS_MISSING in n]
    if missing:
        numbers[NVML_PER_PROCESS_MISSING] = "; ".join(missing)
    return {"peak_rss_mb": rss_mb, **numbers, "by_device": by_device}


def largest_over_ranks(memory_by_rank: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    """Each of `keys` at its largest over the ranks that report it (NVML may see one rank's process and not
    another's); a key no rank reports is left out. Which ranks reported stays in `memory_by_rank`."""
    return {key: max(m[key] for m in memory_by_rank if key in m) for key in keys
            if any(key in m for m in memory_by_rank)}


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank stores (a DTensor's local shard)."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def tensor_mb(tensors: list[torch.Tensor]) -> float:
    """MiB of distinct storage behind `tensors` (a tied weight counts once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.numel()}
    return sum(storages.values()) / 2**20
