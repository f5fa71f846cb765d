"""The torch names the suite uses whose place or signature changed between the oldest torch it runs on
(`Strategy.needs_torch`, suite.strategies.base) and the pinned one, each taken from where this torch has it."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import DTensor  # public from torch 2.5
except ImportError:
    from torch.distributed._tensor import DTensor  # noqa: F401 (re-exported) torch 2.1 to 2.4

# init_process_group(device_id=) binds the process group to the rank's GPU at once (torch 2.2, pytorch#114916).
INIT_TAKES_DEVICE_ID = "device_id" in inspect.signature(dist.init_process_group).parameters


def grad_scaler(device_type: str):
    """fp16's loss scaler: torch.amp.GradScaler(device) from torch 2.3, torch.cuda.amp.GradScaler before (fp16
    runs on GPUs only)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device_type)
    return torch.cuda.amp.GradScaler()
