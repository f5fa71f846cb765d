"""Peak memory of this rank: CUDA allocator and NVML on GPU, peak resident set size on CPU."""

from __future__ import annotations

import os
import resource

import torch


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _nvml_process_mb(device: torch.device) -> float | None:
    """Memory NVML sees this process hold on its GPU (allocator cache, CUDA context, NCCL buffers)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index)
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
