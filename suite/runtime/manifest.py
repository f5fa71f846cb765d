"""What a result was measured on: packages, devices, hosts, scheduler job; and the process-wide settings of a rank
that move performance without being a knob of the point: TF32 for float32 products, cuDNN's autotuner, and the
environment the communication libraries read (NCCL_*, TORCH_NCCL_*, HOROVOD_*, a site's job setup may export any of
them), recorded with the run as params `effective.<name>`."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path

import torch

from suite.runtime.rendezvous import scheduler_job_id
from suite.runtime.torch_api import convolution_tf32, matmul_tf32

PACKAGES = ("torch", "torchvision", "numpy", "hydra-core", "omegaconf", "mlflow", "nvidia-ml-py",
            "scikit-learn", "deepspeed", "horovod", "torchgpipe")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def rank_info(device: torch.device) -> dict:
    """What one rank runs on; rank 0 gathers these from all ranks."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model(),
        "threads": torch.get_num_threads(),
    }


def gpu_driver() -> str | None:
    """The NVIDIA driver's version (NVML), None without a GPU or NVML."""
    if not torch.cuda.is_available():
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML missing or not answering: the manifest says nothing of the driver
        return None


def environment_manifest(ranks: list[dict], backend: str) -> dict:
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
        "gpu_driver": gpu_driver(),
        "backend": backend,
        "cpu_count": os.cpu_count(),
        "hosts": sorted({r["host"] for r in ranks}),
        "ranks": ranks,
        "scheduler_job_id": scheduler_job_id(os.environ),
    }


COMMUNICATION_ENV = ("NCCL_", "TORCH_NCCL_", "HOROVOD_", "GLOO_", "UCX_", "FI_")


def process_settings() -> dict[str, object]:
    settings: dict[str, object] = {"tf32.matmul": matmul_tf32(), "tf32.conv": convolution_tf32(),
                                   "cudnn.benchmark": torch.backends.cudnn.benchmark}
    settings.update({f"env.{k}": v for k, v in sorted(os.environ.items()) if k.startswith(COMMUNICATION_ENV)})
    return settings
