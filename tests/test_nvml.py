"""NVML's view of a rank's GPU: found by the GPU's UUID, not the CUDA index (which NVML does not share); the GPU's
used memory when NVML cannot tell this process's own (a container's pids, MIG) and the process is alone on the GPU;
a rank driving several GPUs (gpipe); and a point's summary when NVML saw some ranks' processes and not others'."""

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from suite.runtime.metrics import (
    NVML_PER_PROCESS_MISSING,
    GpuView,
    _gpu_view,
    largest_over_ranks,
    nvml_numbers,
    nvml_uuid,
    peak_memory,
)
from suite.shared_names import DEVICE_MEMORY, MEMORY_SPLIT

MIB = 2**20
PID = os.getpid()
# Two GPUs as NVML numbers them: UUID, the processes NVML lists on it, the memory used on it. The rank's process
# runs on the second, which CUDA_VISIBLE_DEVICES=1 shows the rank as cuda:0.
NVML_GPUS = [("GPU-0b1d2c3e-aaaa-4bbb-8ccc-000000000000", [SimpleNamespace(pid=1, usedGpuMemory=512 * MIB)], 600 * MIB),
             ("GPU-5f6e7d8c-dddd-4eee-8fff-111111111111", [SimpleNamespace(pid=PID, usedGpuMemory=900 * MIB)],
              1000 * MIB)]


def stand_in_nvml(gpus) -> SimpleNamespace:
    """NVML's calls (which need a driver) over `gpus`, none of them split into MIG instances."""
    handles = {uuid: SimpleNamespace(processes=processes, used=used) for uuid, processes, used in gpus}

    class NVMLError(Exception):
        pass

    def mig_mode(handle):
        raise NVMLError("Not Supported")

    return SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None, NVMLError=NVMLError,
                           NVML_DEVICE_MIG_ENABLE=1,
                           nvmlDeviceGetHandleByIndex=lambda index: handles[gpus[index][0]],
                           nvmlDeviceGetHandleByUUID=lambda uuid: handles[uuid],
                           nvmlDeviceGetComputeRunningProcesses=lambda handle: handle.processes,
                           nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(used=handle.used),
                           nvmlDeviceIsMigDeviceHandle=lambda handle: 0, nvmlDeviceGetMigMode=mig_mode)


def test_torchs_uuid_takes_nvmls_gpu_prefix():
    assert nvml_uuid("5f6e7d8c-dddd-4eee-8fff-111111111111") == "GPU-5f6e7d8c-dddd-4eee-8fff-111111111111"
    assert nvml_uuid("GPU-5f6e7d8c-dddd-4eee-8fff-111111111111") == "GPU-5f6e7d8c-dddd-4eee-8fff-111111111111"
    assert nvml_uuid("MIG-5f6e7d8c-dddd-4eee-8fff-111111111111") == "MIG-5f6e7d8c-dddd-4eee-8fff-111111111111"


def test_a_rank_bound_to_one_gpu_reads_its_own_gpu(monkeypatch):
    """torch reports cuda:0's UUID in its own form, without "GPU-"."""
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_nvml(NVML_GPUS))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(uuid="5f6e7d8c-dddd-4eee-8fff-111111111111"))
    view = _gpu_view(torch.device("cuda", 0))
    assert view == GpuView(NVML_GPUS[1][1], 1000 * MIB, False)
    assert nvml_numbers(view, PID, ranks_share_gpu=False) == {"nvml_used_mb": 900.0}


def process(pid: int, mb: float | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=None if mb is None else mb * MIB)


# NVML's view of the GPU -> (nvml_used_mb or None, words of the reason its per-process number is missing or None)
NVML_CASES = {
    "this pid listed": (GpuView([process(PID, 900), process(7, 100)], 1100 * MIB), (900.0, None)),
    "another pid alone (a container's pid namespace)": (GpuView([process(4242, 900)], 1000 * MIB),
                                                        (1000.0, "not among the 1")),
    "no process listed": (GpuView([], 1000 * MIB), (1000.0, "not among the 0")),
    "this pid without memory, alone (MIG instance)": (GpuView([process(PID, None)], 1000 * MIB),
                                                      (1000.0, "without its memory (MIG)")),
    "several processes, this pid not among them": (GpuView([process(4242, 900), process(4243, 900)], 2000 * MIB),
                                                   (None, "2 processes use the GPU")),
    "a whole GPU split into MIG instances": (GpuView([], 5000 * MIB, split_by_mig=True),
                                             (None, "split into MIG instances")),
    "NVML unavailable": ("NVML not readable: NVMLError_LibraryNotFound", (None, "NVMLError_LibraryNotFound")),
}


@pytest.mark.parametrize("case", NVML_CASES)
def test_nvml_falls_back_to_the_gpus_used_memory_only_for_a_process_alone_on_it(case):
    view, (used_mb, why) = NVML_CASES[case]
    numbers = nvml_numbers(view, PID, ranks_share_gpu=False)
    assert numbers.get("nvml_used_mb") == used_mb
    if why is None:
        assert NVML_PER_PROCESS_MISSING not in numbers
    else:
        assert why in numbers[NVML_PER_PROCESS_MISSING]


def test_ranks_sharing_gpus_never_take_the_gpus_used_memory_as_their_own():
    """NVML may list no process at all (not permitted to): the job's own setting says the GPU is shared."""
    numbers = nvml_numbers(GpuView([], 2000 * MIB), PID, ranks_share_gpu=True)
    assert "nvml_used_mb" not in numbers and "cluster.share_gpus" in numbers[NVML_PER_PROCESS_MISSING]


def test_without_a_driver_nvml_says_why_it_is_not_read():
    """This machine has no NVIDIA driver (or, under `make test`, no visible GPU): the real NVML calls fail."""
    view = _gpu_view(torch.device("cuda", 0))
    assert isinstance(view, str) and view.startswith("NVML not readable: ")
    assert nvml_numbers(view, PID, ranks_share_gpu=False) == {NVML_PER_PROCESS_MISSING: view}


def test_a_rank_driving_several_gpus_reports_the_largest_and_each_gpus_own(monkeypatch):
    """A gpipe process on cuda:0 and cuda:1 (NVML's two GPUs in order; NVML sees the process only on the second):
    each number is the largest over its GPUs, and `by_device` keeps every GPU's own."""
    gpus = [(NVML_GPUS[0][0], [process(4242, 700)], 3000 * MIB), NVML_GPUS[1]]
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_nvml(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(uuid=gpus[device.index][0].removeprefix("GPU-")))
    allocated, reserved = {0: 100 * MIB, 1: 300 * MIB}, {0: 200 * MIB, 1: 800 * MIB}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocated[device.index])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: reserved[device.index])

    numbers = peak_memory(torch.device("cuda", 0), torch.device("cuda", 1))
    first, second = numbers["by_device"]["cuda:0"], numbers["by_device"]["cuda:1"]
    # cuda:0: another pid alone on it, so the GPU's used memory; cuda:1: the process's own.
    assert (first["nvml_used_mb"], first["peak_memory_mb"]) == (3000.0, 3000.0)
    assert (second["nvml_used_mb"], second["peak_memory_mb"]) == (900.0, 900.0)
    assert {k: numbers[k] for k in ("peak_memory_mb", *DEVICE_MEMORY)} == {
        "peak_memory_mb": 3000.0, "peak_cuda_allocated_mb": 300.0, "peak_cuda_reserved_mb": 800.0,
        "nvml_used_mb": 3000.0}
    assert numbers[NVML_PER_PROCESS_MISSING].startswith("cuda:0: this process")
    assert NVML_PER_PROCESS_MISSING not in second


def test_on_cpu_the_peak_is_the_resident_set():
    numbers = peak_memory(torch.device("cpu"))
    assert numbers.keys() == {"peak_rss_mb", "peak_memory_mb"} and numbers["peak_memory_mb"] > 0


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
