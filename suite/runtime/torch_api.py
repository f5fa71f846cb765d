"""The torch names the suite uses whose place or signature changed between the oldest torch it runs on
(`Strategy.needs_torch`, suite.strategies.base) and the pinned one, each taken from where this torch has it."""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist


def is_dtensor(value) -> bool:
    """Whether `value` is a DTensor (torch.distributed.tensor's, public from torch 2.5; torch.distributed._tensor's in
    torch 2.1 to 2.4), without importing that module (0.4 s, sympy with it) in a process where nothing made one: no
    DTensor exists before its module is imported."""
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        dtensor = getattr(sys.modules.get(name), "DTensor", None)
        if dtensor is not None and isinstance(value, dtensor):
            return True
    return False


# TF32 on GPUs: newer torch sets it per backend and operator through `fp32_precision`, and once anything in the
# process does, reading the legacy flags (`allow_tf32`, `get_float32_matmul_precision`) raises RuntimeError.
def _has_fp32_precision(backend) -> bool:
    try:
        return getattr(backend, "fp32_precision") is not None  # noqa: B009 (hasattr would not catch the below)
    except (AttributeError, AssertionError):  # torch 2.1's cuda.matmul raises AssertionError for a name it lacks
        return False


MATMUL_FP32_PRECISION = _has_fp32_precision(torch.backends.cuda.matmul)
CONV_FP32_PRECISION = hasattr(torch.backends.cudnn, "conv") and hasattr(torch.backends.cudnn.conv, "fp32_precision")

# init_process_group(device_id=) binds the process group to the rank's GPU at once (torch 2.2, pytorch#114916).
INIT_TAKES_DEVICE_ID = "device_id" in inspect.signature(dist.init_process_group).parameters


def fsdp_param_groups(state) -> list:
    """An FSDP2 unit's parameter groups: a list in torch 2.14 (`_fsdp_param_groups`), one group or None in torch 2.11
    (`_fsdp_param_group`)."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    return [state._fsdp_param_group] if state._fsdp_param_group is not None else []


def grad_scaler(device_type: str):
    """fp16's loss scaler: torch.amp.GradScaler(device) from torch 2.3, torch.cuda.amp.GradScaler before (fp16
    runs on GPUs only)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device_type)
    return torch.cuda.amp.GradScaler()


def matmul_tf32() -> bool:
    """Whether float32 matrix products on GPUs may run in TF32 (torch's default: no)."""
    if MATMUL_FP32_PRECISION:
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    return torch.backends.cuda.matmul.allow_tf32


def convolution_tf32() -> bool:
    """Whether cuDNN may run float32 convolutions in TF32 (torch's default: yes)."""
    if CONV_FP32_PRECISION:
        return torch.backends.cudnn.conv.fp32_precision == "tf32"
    return torch.backends.cudnn.allow_tf32


def set_math(tf32: bool | None, cudnn_benchmark: bool) -> None:
    """For the rest of the process: float32 products and convolutions in TF32 or not (None: torch's defaults), and
    cuDNN's autotuner (`math` of a point's config)."""
    if tf32 is not None:
        if MATMUL_FP32_PRECISION:
            torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"
        else:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        if CONV_FP32_PRECISION:
            torch.backends.cudnn.conv.fp32_precision = "tf32" if tf32 else "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark


@contextlib.contextmanager
def matmuls_in_tf32(enabled: bool) -> Iterator[None]:
    """Float32 matrix products on GPUs in TF32 (`enabled`) or in full float32 while the block runs; as before
    after it."""
    flags = torch.backends.cuda.matmul
    if MATMUL_FP32_PRECISION:
        name, value = "fp32_precision", "tf32" if enabled else "ieee"
    else:
        name, value = "allow_tf32", enabled
    previous = getattr(flags, name)
    setattr(flags, name, value)
    try:
        yield
    finally:
        setattr(flags, name, previous)


def all_gather_autograd(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """`tensor` of every rank of `group` concatenated along `dim`, whose backward reduce-scatters the gradient back
    (torch's functional collectives: `all_gather_single_autograd`, `all_gather_tensor_autograd` in older torch;
    `torch.distributed.nn.functional.all_gather`, which does it too, is deprecated)."""
    from torch.distributed import _functional_collectives as funcol

    gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
    return funcol.wait_tensor(gather(tensor, dim, group))
