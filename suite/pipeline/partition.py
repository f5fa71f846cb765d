"""Cutting a network's layer list into contiguous pipeline stages.

`balance` is an explicit list of layers per stage, `by_params` (equal parameter counts), or
`by_time` (torchgpipe's balancer: each layer's forward + backward timed on one device, then the
split that equalises time). Both balancers use torchgpipe's block-partition solver.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchgpipe.balance import balance_by_time, balance_cost

from suite.errors import ConfigError
from suite.models.layers import Layer
from suite.runtime.metrics import free_cached_memory


def check_balance(balance, layers: int, stages: int) -> None:
    """Before launch: the balance knob fits the network's layer count and the stage count."""
    if stages > layers:
        raise ConfigError(f"{stages} pipeline stages but the network has only {layers} layers")
    if isinstance(balance, str):  # by_params or by_time: the knob's type (suite.strategies.pipeline)
        return
    sizes = list(balance)
    if len(sizes) != stages or any(size < 1 for size in sizes) or sum(sizes) != layers:
        raise ConfigError(f"balance={sizes} must give each of {stages} stages at least one layer and "
                          f"sum to the network's {layers} layers")


def stage_sizes(balance, layers: Sequence[Layer], stages: int, sample: torch.Tensor,
                device: torch.device) -> list[int]:
    """Layers per stage. `by_time` runs the layers on `sample` (one micro-batch), so every rank must
    decide from the same measurement: callers broadcast rank 0's answer."""
    if not isinstance(balance, str):
        return list(balance)
    if balance == "by_params":
        costs = [sum(p.numel() for p in layer.module.parameters()) for layer in layers]
        return balance_cost([max(cost, 1) for cost in costs], stages)
    sequential = nn.Sequential(*(layer.module for layer in layers))
    # The profiler feeds each layer a leaf tensor, which in-place activations may not modify.
    in_place = [m for m in sequential.modules() if getattr(m, "inplace", False)]
    for module in in_place:
        module.inplace = False
    sizes = balance_by_time(stages, sequential, sample, timeout=1.0, device=device)
    for module in in_place:
        module.inplace = True
    for param in sequential.parameters():
        param.grad = None  # the profiler's backward passes leave gradients behind
    # The layer copies' memory, cached until freed, back to the driver: ranks sharing the GPU set up next.
    free_cached_memory(device)
    return sizes


def cut(layers: Sequence[Layer], sizes: Sequence[int]) -> list[list[Layer]]:
    """Contiguous groups of `sizes` layers. A stage's input arrives as a leaf tensor that autograd
    forbids modifying in place, so an in-place activation that opens a stage is made out-of-place."""
    bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    groups = [list(layers[a:b]) for a, b in zip(bounds, bounds[1:])]
    for group in groups:
        if getattr(group[0].module, "inplace", False):
            group[0].module.inplace = False
    return groups


class StageModule(nn.Module):
    """One pipeline stage: its layers in order, reporting weights under the whole network's names."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layer.module for layer in layers)
        self.named_layers = list(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def named_state(self) -> dict[str, torch.Tensor]:
        return {name: value for layer in self.named_layers for name, value in layer.named_state().items()}


def untie(layers: Sequence[Layer], ties: list[list[tuple[int, str]]]) -> list[list[nn.Parameter]]:
    """Give every layer after the first its own copy of a tied parameter (torchgpipe rejects a parameter
    shared between partitions); returns the copies of each tie, whose gradients `sum_grads` adds up."""
    copies = []
    for places in ties:
        first_index, first_name = places[0]
        shared = layers[first_index].module.get_parameter(first_name)
        group = [shared]
        for index, name in places[1:]:
            owner, _, attr = name.rpartition(".")
            copy = nn.Parameter(shared.detach().clone())
            setattr(layers[index].module.get_submodule(owner), attr, copy)
            group.append(copy)
        copies.append(group)
    return copies


def sum_grads(copies: list[nn.Parameter]) -> None:
    """Every copy of a tied parameter gets the sum of their gradients, as the shared parameter would."""
    grads = [p.grad for p in copies if p.grad is not None]
    if not grads:
        return
    total = sum(g.to(grads[0].device) for g in grads)
    for param in copies:
        param.grad = total.to(param.device, copy=True)
