"""Activation checkpointing (`activation_checkpointing`): a checkpointed module keeps only its input for
backward and runs its forward again there, trading compute for activation memory.

The unit is a block of `suite.models.layers` (a GPT-2 block, a ResNet block, a VGG convolution);
`every` checkpoints each block (full recomputation), k every k-th one (the k-th, 2k-th, ..., as torchtitan counts).
`selective` checkpoints only each GPT-2 block's attention core (softmax(q k^T) v: Megatron-LM's selective
recomputation, Korthikanti et al. 2022), whose scores, softmax and dropout mask are the activations that grow with
the sequence squared and cost few FLOPs to compute again; with a fused attention kernel, which keeps no scores,
it saves little. The
checkpoint function is the strategy's: torch.utils.checkpoint, or DeepSpeed's under `zero`. The network's
first layer, which reads the data (a VGG's or MobileNetV2's first convolution), is not a candidate: it keeps
its input for backward either way, and under DeepSpeed's reentrant checkpoint an output computed from inputs
that need no gradient would cut the gradient of every layer before the loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from suite.errors import BadValue
from suite.models.gpt2 import AttentionCore
from suite.models.layers import block_layers, flatten_layers

SELECTIVE = "selective"


def checkpoint_interval(value: str) -> int:
    """Every how many blocks one is checkpointed whole: 0 for `none` and `selective`, 1 for `every`, else the k
    given."""
    if value in ("none", SELECTIVE):
        return 0
    if value == "every":
        return 1
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise BadValue(f"activation_checkpointing={value} is not none, every, selective or a block interval k >= 1")


def recomputes(value: str) -> bool:
    """Whether `activation_checkpointing=value` recomputes anything."""
    return value == SELECTIVE or checkpoint_interval(value) > 0


def attention_cores(model: nn.Module) -> list[str]:
    """The qualified names of the model's attention cores, which `selective` recomputes."""
    return [name for name, module in model.named_modules() if isinstance(module, AttentionCore)]


def apply_activation_checkpointing(model: nn.Module, value: str, checkpoint_fn: Callable | None) -> int:
    """Wrap what `activation_checkpointing=value` recomputes of the plain model, in place: every k-th block, or
    (`selective`) every attention core; return how many modules were wrapped. `checkpoint_fn` runs a module with
    checkpointing (None: torch.utils.checkpoint, non-reentrant). Parameter names in state dicts stay those of the
    plain model."""
    interval = checkpoint_interval(value)
    first = flatten_layers(model)[0]
    candidates = [layer.prefix.removesuffix(".") for layer in block_layers(model) if layer.prefix != first.prefix]
    chosen = [name for i, name in enumerate(candidates, 1) if interval and i % interval == 0]
    if value == SELECTIVE:
        chosen = attention_cores(model)
    for qualified in chosen:
        parent, _, name = qualified.rpartition(".")
        wrapped = checkpoint_wrapper(model.get_submodule(qualified), checkpoint_fn=checkpoint_fn)
        model.get_submodule(parent).register_module(name, wrapped)
    return len(chosen)


AUTOCAST_DEVICES = ("cpu", "cuda")


def recomputed_under_forward_autocast(checkpoint: Callable) -> Callable:
    """`checkpoint` (a reentrant checkpoint function such as DeepSpeed's) made to recompute a block in backward
    under the autocast its forward ran under, as torch.utils.checkpoint does by itself. Backward runs outside the
    step's autocast, so a recomputation left alone would run in fp32, and the gradients would be those of other
    activations than the forward's."""
    def checkpointed(function: Callable, *args, **kwargs):
        forward_autocast = {device: torch.get_autocast_dtype(device) for device in AUTOCAST_DEVICES
                            if torch.is_autocast_enabled(device)}

        def under_forward_autocast(*inputs):
            with contextlib.ExitStack() as stack:
                for device, dtype in forward_autocast.items():
                    stack.enter_context(torch.autocast(device, dtype=dtype))
                return function(*inputs)
        return checkpoint(under_forward_autocast, *args, **kwargs)
    return checkpointed
