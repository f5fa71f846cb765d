"""Megatron-LM's tensor (intra-layer) parallelism for GPT-2, with torch.distributed.tensor.parallel.

`tp` consecutive ranks split every block: attention qkv and the MLP up-projection by columns, the attention
output and MLP down-projection by rows, so each block does one all-reduce in forward and one in backward per
sub-layer. With `vocab_parallel` the token embedding and the LM head tied to it are split by vocabulary rows
too, unevenly where tp does not divide the vocabulary (GPT-2's 50257), and the logits are gathered for the
loss; otherwise they stay whole on every rank. With `sequence_parallel` the LayerNorms and residual stream
between the split layers are split along the sequence (Megatron-LM's sequence parallelism): each all-reduce
becomes a reduce-scatter plus an all-gather, and activations there take 1/tp of the memory. `dp = workers /
tp` such groups are data-parallel replicas on the `dp` axis of the point's device mesh; each reads its own
data shard and they average gradients after backward. Study N's Megatron-intra is dp=1, Megatron-data is tp=1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout, divisors
from suite.runtime.dist import all_reduce_flat
from suite.runtime.memory import local_tensor
from suite.runtime.optim import build_optimizer
from suite.strategies.base import DataParallel, RankContext, Strategy, Supports
from suite.vocabulary import ELEMENTWISE_OPTIMIZERS, Family

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

# torch.distributed.tensor (DTensor's placements, public from torch 2.5) is imported where a plan is made: this module
# imports on older torch, where a megatron point is refused (`needs_torch`).


def block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """How one GPT-2 block is split. Under sequence parallelism the block's input and output are this
    rank's slice of the sequence: the LayerNorms run on it, the attention and MLP inputs are gathered
    whole, and their row-parallel outputs are reduce-scattered back into slices."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    plan: dict[str, ParallelStyle] = {"attn.qkv": ColwiseParallel(), "mlp.fc": ColwiseParallel()}
    if not sequence_parallel:
        return plan | {"attn.proj": RowwiseParallel(), "mlp.proj": RowwiseParallel()}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)
    return plan | {"ln_1": SequenceParallel(), "ln_2": SequenceParallel(), "attn": gather, "mlp": gather,
                   "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
                   "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}


def ends_plan(vocab_parallel: bool, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The embedding before the blocks and the final LayerNorm and head after them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {}
    if vocab_parallel:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
        plan["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    elif sequence_parallel:
        plan["head"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                          use_local_output=True)
    if sequence_parallel:  # the blocks' input: this rank's slice of the embedded sequence
        plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(seq,),
                                              use_local_output=True)
        plan["ln_f"] = SequenceParallel()
    return plan


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, vocab_parallel: bool, sequence_parallel: bool) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    for block in model.blocks:
        parallelize_module(block, mesh, block_plan(sequence_parallel))
    parallelize_module(model, mesh, ends_plan(vocab_parallel, sequence_parallel))
    if vocab_parallel:  # splitting gave the head its own Parameter around the embedding's shard: tie them again
        model.head.weight = model.tok_emb.weight


class TensorParallel(DataParallel):
    """Each rank holds its tensor-parallel shards; replicas holding the same shards average their gradients
    after backward (one all-reduce over the data-parallel group)."""

    def __init__(self, rank: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer, dp_group) -> None:
        super().__init__(rank, model, optimizer)
        self.dp_group = dp_group

    def backward(self, loss: torch.Tensor) -> None:
        super().backward(loss)
        dp = self.rank.layout.dp
        if dp > 1:
            all_reduce_flat([local_tensor(p.grad) for p in self.model.parameters() if p.grad is not None],
                            self.dp_group, dp)


@dataclass(frozen=True)
class Megatron(Strategy):
    name: str = "megatron"
    family: ClassVar[Family] = Family.tensor_parallel
    label: ClassVar[str] = "Megatron"
    # Parameters are sharded (element-wise updates only); the tensor-parallel plan addresses the plain blocks,
    # not checkpoint wrappers.
    supports: ClassVar[Supports] = Supports(counts_communication=True, optimizers=ELEMENTWISE_OPTIMIZERS,
                                            activation_checkpointing=False)
    needs_torch: ClassVar[str] = "2.5"  # torch.distributed.tensor, DTensor's public API
    tp: int = 2
    batch_grows_with_tp: bool = True
    vocab_parallel: bool = False
    sequence_parallel: bool = False

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[f"strategy.tp={tp}"] for tp in divisors(workers)]

    def check(self, cfg) -> None:
        net = cfg.network
        if net.arch != "gpt2":
            raise ConfigError(f"strategy megatron splits GPT-2's attention and MLP; network {net.name} ({net.arch}) "
                              "has no such layers")
        if self.tp < 1 or cfg.workers % self.tp:
            raise ConfigError(f"strategy megatron: tp={self.tp} does not divide workers={cfg.workers}")
        if net.n_head % self.tp:
            raise ConfigError(f"strategy megatron: tp={self.tp} does not divide n_head={net.n_head} of {net.name}")
        if self.sequence_parallel and cfg.dataset.seq_len % self.tp:
            raise ConfigError(f"strategy megatron: sequence_parallel needs tp={self.tp} to divide "
                              f"dataset.seq_len={cfg.dataset.seq_len}")

    def layout(self, cfg) -> Layout:
        """With `batch_grows_with_tp` (Study N's Megatron-intra) the batch per worker is fixed, so each
        tensor-parallel group trains on batch_size x tp; otherwise each group trains on batch_size."""
        return Layout(dp=cfg.workers // self.tp, tp=self.tp,
                      mini_batch=cfg.batch_size * (self.tp if self.batch_grows_with_tp else 1))

    def setup(self, model: nn.Module, rank: RankContext) -> TensorParallel:
        mesh = rank.layout.mesh(rank.env.device.type)
        model = model.to(rank.env.device)
        apply_tensor_parallel(model, mesh["tp"], self.vocab_parallel, self.sequence_parallel)
        rank.precision.shard_over(mesh["tp"].get_group())
        # The split layers' parameters are DTensors, the others plain tensors: torch's multi-tensor optimizer
        # kernels, its default on a GPU, refuse the mix (seen on an H100), so they are off.
        optimizer = build_optimizer(model.parameters(), rank.cfg.optimizer, foreach=False)
        return TensorParallel(rank, model, optimizer,
                              mesh["dp"].get_group())
