"""A layer's attention cores (GPT-2's softmax(q k^T) v, `suite.models.gpt2.AttentionCore`) watched while the layer
runs forward: whether one is running now, and what each run was given. What autograd saves while one runs, and
nowhere else, less those inputs, is what selective recomputation frees (`activation_checkpointing=selective`);
suite.profiling.measure measures it, suite.profiling.counted counts it."""

from __future__ import annotations

import torch
from torch import nn

from suite.models.gpt2 import AttentionCore


class CoreWatch:
    """Used as a context around a layer's forward."""

    def __init__(self, layer: nn.Module) -> None:
        self.cores = [module for module in layer.modules() if isinstance(module, AttentionCore)]
        self.inside = False
        self.inputs: list[tuple[torch.Tensor, ...]] = []  # one tuple per core run

    def __enter__(self) -> CoreWatch:
        self.hooks = [hook for core in self.cores for hook in (core.register_forward_pre_hook(self._enter),
                                                               core.register_forward_hook(self._leave))]
        return self

    def __exit__(self, *_) -> None:
        for hook in self.hooks:
            hook.remove()

    def _enter(self, _module, inputs) -> None:
        self.inside = True
        self.inputs.append(tuple(t for t in inputs if t is not None))  # a core's mask is None unless given

    def _leave(self, *_) -> None:
        self.inside = False
