"""Model FLOPs of one training step, counted by torch's FlopCounterMode: 2 FLOPs per multiply-add, matrix
products, convolutions and attention, forward and backward (elementwise operations, normalisation, the loss
and the optimizer are not counted).

The count runs once per point, on the meta device: a copy of the network built there computes no numbers,
so counting costs a fraction of a second at any batch and touches neither the real model nor the timed steps.
It is taken at one replica's mini-batch. The recomputation of activation checkpointing is counted apart, by
counting the copy again with the point's blocks (or attention cores) checkpointed: MFU divides model FLOPs (none
recomputed), HFU the FLOPs the devices compute. Attention is counted as the math kernel's two batched products over the
whole (uncausal) score matrix, whatever kernel the device runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from suite.models import build_model
from suite.runtime.activation_checkpointing import apply_activation_checkpointing, recomputes

META = torch.device("meta")


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                       _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """A convolution's backward: each gradient asked for (input, weight) takes as many multiply-adds as the
    forward, where each output element (of a transposed convolution: each input element) meets
    prod(w_shape[1:]) weights. torch 2.14's own formula counts the weight gradient of a grouped convolution as
    if every input channel met every output channel, a depthwise convolution's channels times over (the fix is
    pytorch/pytorch#183405); counted so, MobileNetV2's backward was 20 times its forward."""
    return sum(output_mask[:2]) * 2 * prod(x_shape if transposed else grad_out_shape) * prod(w_shape[1:])


FORMULAS = {torch.ops.aten.convolution_backward: conv_backward_flop}  # over torch's own


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step of one replica."""

    forward: int
    model: int  # forward and backward, no recomputation
    hardware: int  # what the devices compute: `model` plus the forward passes computed again in backward


def count_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> tuple[int, int]:
    """FLOPs of the forward pass and of forward and backward together, of one step of `model` on this batch."""
    with FlopCounterMode(display=False, custom_mapping=FORMULAS) as counter:
        loss = loss_fn(model(inputs), targets)
        forward = counter.get_total_flops()
        loss.backward()
    return forward, counter.get_total_flops()


def meta_batch(sample: tuple[torch.Tensor, torch.Tensor], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch shaped like `batch` items such as `sample` (inputs, target), on the meta device."""
    return tuple(torch.empty((batch, *torch.as_tensor(t).shape), dtype=torch.as_tensor(t).dtype, device=META)
                 for t in sample)


def step_flops(network, dataset, sample: tuple[torch.Tensor, torch.Tensor], batch: int, checkpointing: str,
               recomputed_share: float, loss_fn) -> StepFlops:
    """FLOPs of one step of the point's network on `batch` items like `sample`. `checkpointing`: the
    point's `activation_checkpointing` (see suite.runtime.activation_checkpointing); `recomputed_share`:
    the share of the forward pass a strategy's own recomputation runs again (torchgpipe's checkpoint)."""
    inputs, targets = meta_batch(sample, batch)
    with META:
        plain = build_model(network, dataset)
    forward, model = count_step(plain, inputs, targets, loss_fn)
    hardware = model
    if recomputes(checkpointing):
        with META:
            checkpointed = build_model(network, dataset)
        apply_activation_checkpointing(checkpointed, checkpointing, None)
        _, hardware = count_step(checkpointed, inputs, targets, loss_fn)
    return StepFlops(forward, model, round(hardware + recomputed_share * forward))
