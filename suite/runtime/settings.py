"""The process-wide settings of a rank that move performance without being a knob of the point: TF32 for float32
products, cuDNN's autotuner, and the environment the communication libraries read (NCCL_*, TORCH_NCCL_*,
HOROVOD_*, a site's job setup may export any of them). Recorded with the run as params `effective.<name>`."""

from __future__ import annotations

import os

import torch

from suite.runtime.torch_api import convolution_tf32, matmul_tf32

COMMUNICATION_ENV = ("NCCL_", "TORCH_NCCL_", "HOROVOD_", "GLOO_", "UCX_", "FI_")


def process_settings() -> dict[str, object]:
    settings: dict[str, object] = {"tf32.matmul": matmul_tf32(), "tf32.conv": convolution_tf32(),
                                   "cudnn.benchmark": torch.backends.cudnn.benchmark}
    settings.update({f"env.{k}": v for k, v in sorted(os.environ.items()) if k.startswith(COMMUNICATION_ENV)})
    return settings
