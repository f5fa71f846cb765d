"""The training step's numerics: the precision it computes in (autocast and, for fp16, loss scaling) and the
optimizer that applies its update (`optimizer.name`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from suite.runtime.metrics import local_tensor
from suite.runtime.torch_api import grad_scaler


class LocalShardsGradScaler(getattr(torch.amp, "GradScaler", object)):  # torch.amp's from 2.3; sharding needs 2.5
    """fp16 loss scaling for gradients sharded over `group`, DTensors beside plain tensors: GradScaler hands them
    to one foreach kernel, which refuses the mix. This one unscales each rank's local shards and takes the
    inf/NaN flag's maximum over the group, so that every rank skips the same steps (torch's ShardedGradScaler
    overrides `_unscale_grads_` the same way for FSDP1, whose gradients are plain tensors)."""

    def __init__(self, device_type: str, group) -> None:
        super().__init__(device_type)
        self.group = group

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        grads: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for param_group in optimizer.param_groups:
            for param in param_group["params"]:
                if param.grad is not None:
                    local = local_tensor(param.grad)
                    grads.setdefault((local.device, local.dtype), []).append(local)
        with torch.no_grad():
            for same_kind in grads.values():
                torch._amp_foreach_non_finite_check_and_unscale_(same_kind, found_inf, inv_scale)
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.group)
        return {found_inf.device: found_inf}


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

    def shard_over(self, group) -> None:
        """The model's gradients are from now on sharded over the process group `group`."""
        if self.scaler:
            self.scaler = LocalShardsGradScaler(self.device_type, group)

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


class AutocastForward(torch.nn.Module):
    """`module` that computes its forward, and only its forward, in `precision`'s autocast, wherever it is called
    from: on another thread than the step's (torchgpipe's workers; autocast is thread-local), again in backward
    (recomputation), or inside a schedule that runs the backward too (torch.distributed.pipelining), which AMP
    says not to autocast."""

    def __init__(self, module: torch.nn.Module, precision: Precision) -> None:
        super().__init__()
        self.module, self.precision = module, precision

    def forward(self, *args, **kwargs):
        with self.precision.autocast():
            return self.module(*args, **kwargs)


def make_precision(name: str, device: torch.device) -> Precision:
    scaler = grad_scaler(device.type) if name == "fp16" else None
    return Precision(name, device.type, scaler)


def optimizer_implementation(optimizer: torch.optim.Optimizer) -> str:
    """Which of torch's kernels its step runs: fused, foreach (multi-tensor) or for-loop; torch picks for `None`
    by where the parameters are (torch.optim's docs: for-loop < foreach < fused). Another library's optimizer is
    named by its class."""
    if type(optimizer).__module__.split(".")[0] != "torch":
        return type(optimizer).__name__
    if optimizer.defaults.get("fused"):
        return "fused"
    foreach = optimizer.defaults.get("foreach")
    if foreach is None:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for group in optimizer.param_groups for p in group["params"]]
        foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)[1]
    return "foreach" if foreach else "for-loop"


def build_optimizer(params, cfg, foreach: bool | None = None) -> torch.optim.Optimizer:
    """`foreach`: torch's multi-tensor kernels (None: torch's default, on for GPU tensors)."""
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=foreach)
    if cfg.name == "adam":  # L2 weight decay added to the gradient (Study N's ZeRO runs)
        return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=foreach)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay, foreach=foreach)
    if cfg.name == "lamb":  # weight decay inside the update that the layer's trust ratio scales, as in the paper
        from pytorch_optimizer import Lamb  # imported by the ranks that use it only (a second or so)

        return Lamb(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay, weight_decouple=False)
    raise ValueError(f"unknown optimizer {cfg.name!r}")
