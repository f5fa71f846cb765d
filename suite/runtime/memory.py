"""Memory of this rank: peak (CUDA allocator and NVML on GPU, peak resident set size on CPU) and the bytes
held in parameters, gradients and optimizer states (see Strategy.memory_split)."""

from __future__ import annotations

import os
import re
import resource

import torch

from suite.runtime.torch_api import DTensor

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


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def nvml_uuid(cuda_uuid: str) -> str:
    """NVML's name for the GPU that CUDA calls `cuda_uuid` (torch's form: the bare 8-4-4-4-12 hex digits; NVML's:
    the same after "GPU-"). NVML numbers GPUs its own way, blind to CUDA_VISIBLE_DEVICES (a rank bound to one GPU
    sees it as cuda:0), so a GPU is looked up by its UUID, never by the CUDA index."""
    return cuda_uuid if cuda_uuid.startswith(("GPU-", "MIG-")) else f"GPU-{cuda_uuid}"


def _nvml_process_mb(device: torch.device) -> float | None:
    """Memory NVML sees this process hold on its GPU (allocator cache, CUDA context, NCCL buffers)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(str(torch.cuda.get_device_properties(device).uuid)))
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return proc.usedGpuMemory / 2**20
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing, or no permission to list processes (containers)
        return None
    return None


def peak_memory(device: torch.device) -> dict[str, float]:
    """This rank's memory numbers in MiB; `peak_memory_mb` is the one a point reports."""
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    numbers = {"peak_rss_mb": rss_mb}
    if device.type == "cuda":
        numbers["peak_cuda_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        numbers["peak_cuda_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
        nvml = _nvml_process_mb(device)
        if nvml is not None:
            numbers["nvml_used_mb"] = nvml
        numbers["peak_memory_mb"] = max(numbers["peak_cuda_reserved_mb"], nvml or 0.0)
    else:
        numbers["peak_memory_mb"] = rss_mb
    return numbers


def largest_over_ranks(memory_by_rank: list[dict[str, float]], keys: tuple[str, ...]) -> dict[str, float]:
    """Each of `keys` at its largest over the ranks that report it (NVML may see one rank's process and not
    another's); a key no rank reports is left out. Which ranks reported stays in `memory_by_rank`."""
    return {key: max(m[key] for m in memory_by_rank if key in m) for key in keys
            if any(key in m for m in memory_by_rank)}


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank stores (a DTensor's local shard)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def tensor_mb(tensors: list[torch.Tensor]) -> float:
    """MiB of distinct storage behind `tensors` (a tied weight counts once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.numel()}
    return sum(storages.values()) / 2**20
