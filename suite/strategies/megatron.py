"""Megatron-LM's tensor (intra-layer) parallelism for the decoders (GPT-2, Llama 3), with
torch.distributed.tensor.parallel.

`tp` consecutive ranks split every block: attention qkv and the MLP up-projection by columns, the attention
output and MLP down-projection by rows, so each block does one all-reduce in forward and one in backward per
sub-layer. A rank holds whole heads (under grouped-query attention, whole key-value groups: a group's query heads
with the key and value heads they share) and whole units of the MLP. With `vocab_parallel` (the default, as
Megatron-LM's GPT) the token embedding and the LM head (GPT-2's tied to it) are split by vocabulary rows too,
unevenly where tp does not divide the vocabulary (GPT-2's 50257): the logits stay
split by vocabulary and the cross-entropy is computed on the split logits (torch's `loss_parallel`, Megatron-LM's
vocab-parallel cross-entropy), which communicates b x s values instead of gathering the b x s x v logits (only
evaluation, outside the timed steps, gathers them: the training loop's metrics read whole logits); without it, and
at tp=1, the embedding and head are whole on every rank, and each rank computes the whole logits. With
`sequence_parallel` the LayerNorms and residual stream between the split layers are split along the sequence
(Megatron-LM's sequence parallelism): each all-reduce becomes a reduce-scatter plus an all-gather, and activations
there take 1/tp of the memory. `dp = workers / tp` such groups are data-parallel replicas on the `dp` axis of the
point's device mesh; each reads its own data shard and they average gradients: after backward in one flat
all-reduce (Megatron-LM's default), or in buckets overlapped with backward (`overlap_grad_reduce`). As in Megatron-LM
(`get_batch`, `broadcast_data`), only the first rank of a tensor-parallel group loads its batch, and broadcasts it to
the group's other ranks in the step. Study N's
Megatron-intra is dp=1, Megatron-data is tp=1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout, divisors
from suite.models import DECODERS, llama_dims
from suite.runtime.dist import all_reduce_flat, broadcast_batch
from suite.runtime.metrics import local_tensor
from suite.runtime.numerics import build_optimizer
from suite.runtime.torch_api import is_dtensor
from suite.shared_names import ELEMENTWISE_OPTIMIZERS, Family
from suite.strategies.base import DataParallel, GradientSync, RankContext, Strategy, Supports
from suite.strategies.context_parallel import SequenceShard, apply_context_parallel, check_context_split, replica_mesh

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle

# torch.distributed.tensor (DTensor's placements, public from torch 2.5) is imported where a plan is made: this module
# imports on older torch, where a megatron point is refused (`needs_torch`).


def block_plan(sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """How one decoder block is split. Under sequence parallelism the block's input and output are this
    rank's slice of the sequence: the norms run on it, the attention and MLP inputs are gathered
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
    """The embedding before the blocks and the final LayerNorm and head after them. Split by vocabulary, the
    embedding's partial outputs are all-reduced (Megatron's g), the head's input gradient too (its f), and the
    head's output, the logits, stays a DTensor split by vocabulary (Shard(-1)) for `loss_parallel`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    seq = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, ParallelStyle] = {}
    if vocab_parallel:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate())
        plan["head"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    elif sequence_parallel:
        plan["head"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                          use_local_output=True)
    if sequence_parallel:  # the blocks' input: this rank's slice of the embedded sequence
        plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(seq,),
                                              use_local_output=True)
        plan["ln_f"] = SequenceParallel()
    return plan


def split_blocks(blocks, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Split each decoder block of `blocks` over the tensor-parallel `mesh` (`block_plan`)."""
    from torch.distributed.tensor.parallel import parallelize_module

    for block in blocks:  # inside a checkpoint wrapper, the block it wraps: the plan names its submodules
        parallelize_module(getattr(block, "_checkpoint_wrapped_module", block), mesh, block_plan(sequence_parallel))


def is_block(module: nn.Module) -> bool:
    """A decoder block, bare or in activation checkpointing's wrapper."""
    from suite.models import gpt2, llama

    return isinstance(getattr(module, "_checkpoint_wrapped_module", module), (gpt2.Block, llama.Block))


def split_stage(layers: list[nn.Module], mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """A pipeline stage's layers split over its tensor-parallel `mesh`: its blocks, and the embedding or the head
    it holds by vocabulary (`ends_plan`; the logits stay split for `loss_parallel`). Under sequence parallelism a
    stage takes and sends this rank's slice of the sequence (Megatron-LM's pipelines send the split activations): the
    embedding's output is sliced, the blocks and the head take slices."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleOutput, parallelize_module

    split_blocks([layer for layer in layers if is_block(layer)], mesh, sequence_parallel)
    ends = ends_plan(vocab_parallel=True, sequence_parallel=sequence_parallel)
    for layer in layers:
        plan = {name: style for name, style in ends.items() if hasattr(layer, name)}
        if plan:
            parallelize_module(layer, mesh, plan)
        if sequence_parallel and hasattr(layer, "tok_emb"):
            parallelize_module(layer, mesh, PrepareModuleOutput(output_layouts=Replicate(),
                                                                desired_output_layouts=Shard(1), use_local_output=True))


def whole_logits(logits: torch.Tensor, group, tp: int) -> torch.Tensor:
    """The whole logits, as the training loop's metrics read them, from logits split by vocabulary (a DTensor;
    others are returned as they are). Each rank writes its split of the vocabulary into one zeroed tensor, which an
    in-place all-reduce over the group sums: a rank holds the logits whole once, not also in a collective's
    buffers, and gloo, which has no all-gather of GPU tensors (it crashed ranks sharing a GPU), all-reduces them."""
    if not is_dtensor(logits):
        return logits
    split = logits.to_local()
    width = -(-logits.shape[-1] // tp)  # Shard(-1) splits as torch.chunk does
    start = dist.get_rank(group) * width
    whole = torch.zeros(logits.shape, dtype=logits.dtype, device=logits.device)
    whole[..., start:start + split.shape[-1]] = split
    dist.all_reduce(whole, group=group)
    return whole


def whole_sequence_logits(model: nn.Module, inputs: torch.Tensor, tp_group, tp: int,
                          sequence: SequenceShard | None) -> torch.Tensor:
    """Evaluation's logits, whole: over the vocabulary (`whole_logits`) and, under context parallelism, over the
    sequence (each rank runs its part, `SequenceShard.unshard`)."""
    if sequence is None:
        return whole_logits(model(inputs), tp_group, tp)
    return sequence.unshard(whole_logits(model(sequence.take(inputs)), tp_group, tp))


def check_tensor_split(strategy: str, cfg, tp: int, ranks: int, sequence_parallel: bool = False) -> None:
    """Before launch: `tp` ranks can split the point's network (a decoder's attention heads, Llama's key-value heads
    and feed-forward units), and `ranks` (the workers, or a pipeline's ranks) into groups of `tp`; under
    `sequence_parallel`, its sequence too."""
    net = cfg.network
    if tp < 1 or ranks % tp:
        raise ConfigError(f"strategy {strategy}: tp={tp} does not divide {ranks} workers")
    if tp > 1 and net.arch not in DECODERS:
        raise ConfigError(f"strategy {strategy}: tp={tp} splits a decoder's attention and MLP; network {net.name} "
                          f"({net.arch}) has no such layers")
    if net.arch in DECODERS and net.n_head % tp:
        raise ConfigError(f"strategy {strategy}: tp={tp} does not divide n_head={net.n_head} of {net.name}")
    if net.arch == "llama3" and net.n_kv_head % tp:
        raise ConfigError(f"strategy {strategy}: tp={tp} does not divide n_kv_head={net.n_kv_head} of {net.name} "
                          "(a rank holds whole key-value groups)")
    if net.arch == "llama3" and (hidden := llama_dims(net).ffn_hidden) % tp:
        raise ConfigError(f"strategy {strategy}: tp={tp} does not divide the feed-forward width {hidden} of "
                          f"{net.name}")
    if sequence_parallel and tp == 1:
        raise ConfigError(f"strategy {strategy}: sequence_parallel splits the sequence over tensor-parallel ranks; "
                          "set strategy.tp > 1")
    if sequence_parallel and cfg.dataset.seq_len % tp:
        raise ConfigError(f"strategy {strategy}: sequence_parallel needs tp={tp} to divide "
                          f"dataset.seq_len={cfg.dataset.seq_len}")


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, vocab_parallel: bool, sequence_parallel: bool) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    tied = model.head.weight is model.tok_emb.weight  # GPT-2's; Llama's head is its own
    split_blocks(model.blocks, mesh, sequence_parallel)
    parallelize_module(model, mesh, ends_plan(vocab_parallel, sequence_parallel))
    if vocab_parallel and tied:  # splitting gave the head its own Parameter around the embedding's shard: tie again
        model.head.weight = model.tok_emb.weight


def param_groups(model: nn.Module) -> list[dict[str, list[nn.Parameter]]]:
    """The split parameters (DTensors) and the whole ones (plain tensors) in separate param groups: torch's
    multi-tensor (foreach) kernels take one group's tensors at once, and refuse DTensors beside plain tensors."""
    params = list(model.parameters())
    split = [p for p in params if is_dtensor(p)]
    whole = [p for p in params if not is_dtensor(p)]
    return [{"params": group} for group in (split, whole) if group]


def megatron_bucket_size(dp: int) -> int:
    """Megatron-LM's default bucket of gradient elements (DistributedDataParallelConfig.bucket_size unset):
    max(40 M, 1 M x dp), larger for more replicas so that each collective stays bandwidth-bound."""
    return max(40_000_000, 1_000_000 * dp)


class OverlappedReduction:
    """Megatron-LM's `--overlap-grad-reduce` (and torch DDP's buckets): the gradients in buckets of up to
    `bucket_size` elements, filled in the reverse order of the parameters (the order backward produces them); a
    bucket is all-reduced over `group`, asynchronously, as soon as the last of its gradients is accumulated,
    while backward goes on; `finish` waits for them after backward and averages. Disarmed (`armed`, the micro-batches
    before the last where gradients accumulate), it lets the gradients accumulate and launches nothing."""

    def __init__(self, params: list[nn.Parameter], group, dp: int, bucket_size: int) -> None:
        self.group, self.dp = group, dp
        self.buckets: list[list[nn.Parameter]] = [[]]
        filled = 0
        for param in reversed([p for p in params if p.requires_grad]):
            if filled and filled + local_tensor(param).numel() > bucket_size:
                self.buckets.append([])
                filled = 0
            self.buckets[-1].append(param)
            filled += local_tensor(param).numel()
        self.bucket_of = {param: i for i, bucket in enumerate(self.buckets) for param in bucket}
        self.in_flight: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []
        self.armed = True
        self._reset()
        for param in self.bucket_of:
            param.register_post_accumulate_grad_hook(self._accumulated)

    def _reset(self) -> None:
        self.waiting = [len(bucket) for bucket in self.buckets]  # gradients not yet accumulated, per bucket
        self.launched = [False] * len(self.buckets)

    def _accumulated(self, param: nn.Parameter) -> None:
        if not self.armed:
            return
        i = self.bucket_of[param]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        self.launched[i] = True
        grads = [local_tensor(p.grad) for p in self.buckets[i] if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.in_flight.append((dist.all_reduce(flat, group=self.group, async_op=True), flat, grads))

    def finish(self) -> None:
        for i, launched in enumerate(self.launched):  # a bucket holding a parameter that took no gradient
            if not launched:
                self._launch(i)
        for work, flat, grads in self.in_flight:
            work.wait()
            flat /= self.dp
            for grad, chunk in zip(grads, flat.split([g.numel() for g in grads])):
                grad.copy_(chunk.view_as(grad))
        self.in_flight.clear()
        self._reset()


class TensorParallel(DataParallel):
    """Each rank holds its tensor-parallel shards; replicas holding the same shards average their gradients
    over the data-parallel group: after backward in one flat all-reduce, or overlapped with it (`overlapped`); with
    gradient accumulation in the last micro-batch's backward only, as Megatron-LM reduces once a step. The group's
    first rank loads the batch and broadcasts it over `tp_group`."""

    def __init__(self, rank: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer, dp_group, tp_group,
                 vocab_parallel: bool, overlapped: OverlappedReduction | None = None,
                 sequence: SequenceShard | None = None) -> None:
        super().__init__(rank, model, optimizer)
        self.dp_group, self.tp_group, self.sequence = dp_group, tp_group, sequence
        self.split_logits, self.overlapped = vocab_parallel, overlapped
        self.loads_batch = rank.layout.position(rank.env.rank).tp_rank == 0
        self.reduces = True  # this micro-batch's backward reduces the gradients (the last one's)

    @property
    def takes_inputs(self) -> bool:
        return self.loads_batch

    @property
    def takes_targets(self) -> bool:
        return self.loads_batch

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.rank.layout.tp > 1:
            with self.rank.timer.phase("data"):
                inputs, targets = broadcast_batch(inputs, targets, self.tp_group)
        if self.sequence is None:
            return super().train_step(inputs, targets)
        return self.sequence.train_on_part(super().train_step, inputs, targets)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Evaluation: the whole logits (`whole_sequence_logits`)."""
        return whole_sequence_logits(self.model, inputs, self.tp_group, self.rank.layout.tp, self.sequence)

    @contextlib.contextmanager
    def gradient_sync(self, last: bool) -> Iterator[None]:
        """Gradients accumulate locally until the `last` micro-batch, whose backward reduces their sum."""
        self.reduces = last
        if self.overlapped:
            self.overlapped.armed = last
        yield

    def backward(self, loss: torch.Tensor) -> None:
        super().backward(loss)
        if self.reduces:
            self.reduce_gradients()

    def reduce_gradients(self) -> None:
        """Average the gradients over the replicas (and their context-parallel ranks): wait for the buckets
        overlapped with backward, or all-reduce them all now, flattened into one buffer (Megatron-LM 2.x's local DDP:
        one all-reduce per gradient dtype of its contiguous buffer, after backward)."""
        dp = self.rank.layout.dp * self.rank.layout.cp
        if self.overlapped:
            self.overlapped.finish()
        elif dp > 1:
            all_reduce_flat([local_tensor(p.grad) for p in self.model.parameters() if p.grad is not None],
                            self.dp_group, dp)

    def effective_settings(self) -> dict[str, Any]:
        layout = self.rank.layout
        grads = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        if layout.dp == 1:
            reduction = "none (dp=1)"
        elif self.overlapped:
            reduction = (f"overlapped with backward: {len(self.overlapped.buckets)} bucket(s) of {grads} gradients "
                         "all-reduced as they are ready")
        else:
            reduction = f"after backward: one flat all-reduce of the {grads} gradients"
        if self.split_logits:
            vocabulary = "split: logits stay split by vocabulary, loss_parallel cross-entropy"
        elif layout.tp == 1:
            vocabulary = "whole (tp=1)"
        else:
            vocabulary = "whole: embedding, head and logits on every tensor-parallel rank"
        batch = ("tp rank 0 loads it, broadcast to the tensor-parallel group" if layout.tp > 1
                 else "each rank loads its own (tp=1)")
        return {**super().effective_settings(), "megatron.dp_reduction": reduction,
                "megatron.vocab_parallel": vocabulary, "megatron.batch_source": batch}


@dataclass(frozen=True)
class Megatron(Strategy):
    name: str = "megatron"
    family: ClassVar[Family] = Family.tensor_parallel
    label: ClassVar[str] = "Megatron"
    # Parameters are sharded (element-wise updates only). Checkpointed blocks recompute their tensor-parallel
    # forward, collectives included, as Megatron-LM's full recomputation does. Gradients accumulate over `grad_accum`
    # micro-batches, reduced over the replicas once, in the last one's backward.
    supports: ClassVar[Supports] = Supports(counts_communication=True, optimizers=ELEMENTWISE_OPTIMIZERS,
                                            grad_accum=True)
    needs_torch: ClassVar[str] = "2.5"  # torch.distributed.tensor, DTensor's public API
    tp: int = 2
    batch_grows_with_tp: bool = True
    vocab_parallel: bool = True
    sequence_parallel: bool = False
    overlap_grad_reduce: bool = False
    bucket_size: int | None = None  # gradient elements per bucket when overlapped; None: Megatron-LM's default
    cp: int = 1  # context-parallel ranks splitting each sequence (Llama), the gradients averaged over them too

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        """Every tp dividing the workers, and each tp > 1 with sequence parallelism."""
        return ([[f"strategy.tp={tp}"] for tp in divisors(workers)]
                + [[f"strategy.tp={tp}", "strategy.sequence_parallel=true"] for tp in divisors(workers) if tp > 1])

    def check(self, cfg) -> None:
        if cfg.network.arch not in DECODERS:
            raise ConfigError(f"strategy megatron splits a decoder's attention and MLP; network {cfg.network.name} "
                              f"({cfg.network.arch}) has no such layers")
        check_tensor_split(self.name, cfg, self.tp, cfg.workers, self.sequence_parallel)
        check_context_split(self.name, cfg, self.cp, cfg.workers // self.tp)
        if self.bucket_size is not None and self.bucket_size < 1:
            raise ConfigError(f"strategy megatron: bucket_size={self.bucket_size} must be a positive number of "
                              "gradient elements")

    @classmethod
    def probes(cls) -> dict[str, list[str]]:
        return {cls.name: ["strategy.tp=2"]}

    def gradient_sync(self, dp: int) -> GradientSync:
        """With `overlap_grad_reduce`, buckets of fp32 gradients of `bucket_size` elements (Megatron-LM's default
        where unset); else all of them after backward."""
        if not self.overlap_grad_reduce:
            return GradientSync()
        return GradientSync((self.bucket_size or megatron_bucket_size(dp)) * 4)

    def layout(self, cfg) -> Layout:
        """With `batch_grows_with_tp` (Study N's Megatron-intra) the batch per worker is fixed, so each
        tensor-parallel group trains on batch_size x tp; otherwise each group trains on batch_size; either in each of
        `grad_accum` micro-batches per step."""
        return Layout(dp=cfg.workers // (self.tp * self.cp), tp=self.tp, cp=self.cp,
                      mini_batch=cfg.batch_size * (self.tp if self.batch_grows_with_tp else 1) * cfg.grad_accum,
                      micro_batches=cfg.grad_accum)

    def setup(self, model: nn.Module, rank: RankContext) -> TensorParallel:
        mesh = rank.layout.mesh(rank.env.device.type)
        model = model.to(rank.env.device)
        # One tensor-parallel rank has no vocabulary to split: the embedding, head and loss stay torch's own.
        vocab_parallel = self.vocab_parallel and rank.layout.tp > 1
        apply_tensor_parallel(model, mesh["tp"], vocab_parallel, self.sequence_parallel)
        rank.precision.shard_over(mesh["tp"].get_group())
        # Megatron-LM steps with a multi-tensor Adam (apex's or Transformer Engine's FusedAdam); torch's multi-tensor
        # kernels (foreach) are its counterpart, on every device, with split and whole parameters in separate groups.
        optimizer = build_optimizer(param_groups(model), rank.cfg.optimizer, foreach=True)
        sequence = apply_context_parallel(model, mesh, rank.layout, rank.env.rank)
        dp, dp_group = rank.layout.dp * self.cp, replica_mesh(mesh, rank.layout).get_group()
        overlapped = None
        if self.overlap_grad_reduce and dp > 1:
            overlapped = OverlappedReduction(list(model.parameters()), dp_group, dp,
                                             self.bucket_size or megatron_bucket_size(dp))
        return TensorParallel(rank, model, optimizer, dp_group, mesh["tp"].get_group(), vocab_parallel, overlapped,
                              sequence)
