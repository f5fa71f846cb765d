"""Optimizers selectable from the config (`optimizer.name`)."""

from __future__ import annotations

import torch


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
