"""`compile=true`: each decoder block compiled as torchtitan compiles it (torchtitan/models/llama3/infra/parallelize.py,
`apply_compile`): the block's forward, activation checkpointing included, through torch.compile's default backend
(inductor: Triton kernels on a GPU, C++ and OpenMP on a CPU), one whole graph per block (`fullgraph`), in place
(`nn.Module.compile`: parameter names stay the plain model's). Compilation happens on the block's first call, so
the strategy's parallelism, applied after, is what is compiled."""

from __future__ import annotations

import torch
from torch import nn


def compile_blocks(model: nn.Module, blocks: list[str], device: torch.device) -> None:
    """Compile the modules at the qualified names `blocks` (the decoder blocks, found before activation checkpointing
    wrapped them: the wrapper is what is compiled) for ranks on `device`.

    On a CPU, inductor compiles its C++ kernels in the rank's own process, not in its pool of compile workers: a
    kernel built by the pool and loaded into the rank can write past its buffers (pytorch/pytorch#181618: heap
    corruption that in-process compilation, TORCHINDUCTOR_COMPILE_THREADS=1, avoids; seen here as both ranks of a
    compiled DDP point aborting with "malloc(): unaligned tcache chunk detected"), and a CPU node's cores are its
    ranks' already. A GPU rank keeps the pool, which compiles the Triton kernels."""
    if blocks and device.type == "cpu":
        import torch._inductor.config as inductor

        inductor.compile_threads = 1
    for name in blocks:
        model.get_submodule(name).compile(fullgraph=True)
