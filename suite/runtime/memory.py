"""Memory of this rank: peak (CUDA allocator and NVML on GPU, peak resident set size on CPU) and the bytes
held in parameters, gradients and optimizer states (see Strategy.memory_split)."""

from __future__ import annotations

import gc
import os
import re
import resource
from dataclasses import dataclass
from typing import Any

import torch

from suite.point_dir import error_line
from suite.runtime.torch_api import is_dtensor
from suite.shared_names import DEVICE_MEMORY

# Per rank; a point reports the largest. mem_master_mb: fp32 master copies of the parameters that an
# optimizer steps beside the model's own (ZeRO keeps its partition of them even in fp32 training).


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
