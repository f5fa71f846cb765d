"""How much of its devices' peak a point used: MFU (model FLOPs) and HFU (hardware FLOPs, recomputation
included), as PaLM defines them, and the peak they divide by.

A point's FLOPs are counted once (suite.runtime.flops) at one replica's mini-batch; a global step is `dp`
of those. The rate is per device: on GPU a rank's GPU (torchgpipe's process drives `pp` of them); on CPU a
node, whose cores its ranks share. The peak is that device's dense matmul rate for the math dtype the point
computes in, taken, in this order, from:

1. the calibration record of the cluster (`make calibrate`, results/calibration/<cluster>.yaml), if it was
   measured on the same device (a CPU with as many threads as the point's ranks on a node use);
2. the cluster config's `hardware.peak_tflops` (the vendor's datasheet).

There is no default: without either, the run has no `mfu`, and its `suite.mfu_missing` tag says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from suite.calibration_files import DamagedRecord, load_record, reading, record_path
from suite.runtime.flops import StepFlops
from suite.runtime.torch_api import convolution_tf32, matmul_tf32
from suite.vocabulary import MathDtype, PeakSource

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
