"""`compile=true`: each decoder block compiled as torchtitan compiles it (torchtitan/models/llama3/infra/parallelize.py,
`apply_compile`): the block's forward, activation checkpointing included, through torch.compile's default backend
(inductor: Triton kernels on a GPU, C++ and OpenMP on a CPU), one whole graph per block (`fullgraph`), in place
(`nn.Module.compile`: parameter names stay the plain model's). Compilation happens on the block's first call, so
the strategy's parallelism, applied after, is what is compiled."""

from __future__ import annotations

from torch import nn


def compile_blocks(model: nn.Module, blocks: list[str]) -> None:
    """Compile the modules at the qualified names `blocks` (the decoder blocks, found before activation checkpointing
    wrapped them: the wrapper is what is compiled)."""
    for name in blocks:
        model.get_submodule(name).compile(fullgraph=True)
