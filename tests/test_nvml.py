"""NVML's view of a rank's GPU: found by the GPU's UUID, not the CUDA index (which NVML does not share), and a
point's summary when NVML saw some ranks' processes and not others'."""

import os
import sys
from types import SimpleNamespace

import torch

from suite.runtime.memory import _nvml_process_mb, largest_over_ranks, nvml_uuid
from suite.vocabulary import DEVICE_MEMORY, MEMORY_SPLIT

# Two GPUs as NVML numbers them; the rank's process runs on the second, which CUDA_VISIBLE_DEVICES=1 shows the
# rank as cuda:0.
NVML_GPUS = [("GPU-0b1d2c3e-aaaa-4bbb-8ccc-000000000000", [SimpleNamespace(pid=1, usedGpuMemory=512 * 2**20)]),
             ("GPU-5f6e7d8c-dddd-4eee-8fff-111111111111", [SimpleNamespace(pid=os.getpid(),
                                                                            usedGpuMemory=900 * 2**20)])]


def test_torchs_uuid_takes_nvmls_gpu_prefix():
    assert nvml_uuid("5f6e7d8c-dddd-4eee-8fff-111111111111") == "GPU-5f6e7d8c-dddd-4eee-8fff-111111111111"
    assert nvml_uuid("GPU-5f6e7d8c-dddd-4eee-8fff-111111111111") == "GPU-5f6e7d8c-dddd-4eee-8fff-111111111111"
    assert nvml_uuid("MIG-5f6e7d8c-dddd-4eee-8fff-111111111111") == "MIG-5f6e7d8c-dddd-4eee-8fff-111111111111"


def test_a_rank_bound_to_one_gpu_reads_its_own_gpu(monkeypatch):
    """NVML (which needs a driver) is stood in for by its calls over NVML_GPUS; torch reports cuda:0's UUID in
    its own form, without "GPU-"."""
    handles = {uuid: processes for uuid, processes in NVML_GPUS}
    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                           nvmlDeviceGetHandleByIndex=lambda index: NVML_GPUS[index][1],
                           nvmlDeviceGetHandleByUUID=lambda uuid: handles[uuid],
                           nvmlDeviceGetComputeRunningProcesses=lambda handle: handle)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(uuid="5f6e7d8c-dddd-4eee-8fff-111111111111"))
    assert _nvml_process_mb(torch.device("cuda", 0)) == 900.0


def test_the_summary_takes_the_largest_over_the_ranks_that_report():
    """Rank 1's NVML saw no process of its own: the summary still has rank 0's and rank 2's numbers."""
    memory = [{"peak_memory_mb": 900.0, "peak_cuda_allocated_mb": 500.0, "peak_cuda_reserved_mb": 800.0,
               "mem_params_mb": 10.0, "nvml_used_mb": 900.0},
              {"peak_memory_mb": 800.0, "peak_cuda_allocated_mb": 500.0, "peak_cuda_reserved_mb": 800.0,
               "mem_params_mb": 10.0},
              {"peak_memory_mb": 950.0, "peak_cuda_allocated_mb": 600.0, "peak_cuda_reserved_mb": 700.0,
               "mem_params_mb": 10.0, "nvml_used_mb": 950.0}]
    assert largest_over_ranks(memory, (*MEMORY_SPLIT, *DEVICE_MEMORY)) == {
        "mem_params_mb": 10.0, "peak_cuda_allocated_mb": 600.0, "peak_cuda_reserved_mb": 800.0,
        "nvml_used_mb": 950.0}
