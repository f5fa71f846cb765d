"""Optimizers selectable from the config (`optimizer.name`)."""

from __future__ import annotations

import torch

OPTIMIZERS = ("sgd", "adam", "adamw")


def build_optimizer(params, cfg) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.name == "adam":  # L2 weight decay added to the gradient (Study N's ZeRO runs)
        return torch.optim.Adam(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.name!r}")
