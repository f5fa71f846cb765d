"""Numeric precision of the training step: autocast context and, for fp16, loss scaling."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from suite.runtime.torch_api import grad_scaler


@dataclass
class Precision:
    name: str
    device_type: str
    scaler: torch.amp.GradScaler | None = None
    skipped_steps: int = 0  # fp16: optimizer steps the scaler skipped on inf/NaN gradients (its scale then drops)
    scale_after_last_step: float | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.name == "bf16" else torch.float16
        return torch.autocast(self.device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler:
            before = self.scale_after_last_step or self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            self.scale_after_last_step = self.scaler.get_scale()  # a host sync per step, in fp16 runs only
            self.skipped_steps += self.scale_after_last_step < before
        else:
            optimizer.step()


def make_precision(name: str, device: torch.device) -> Precision:
    scaler = grad_scaler(device.type) if name == "fp16" else None
    return Precision(name, device.type, scaler)
