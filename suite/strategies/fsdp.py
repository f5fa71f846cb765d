"""Fully sharded data parallelism with torch FSDP2 (`fully_shard`), one unit per layer plus the root; with
`tp > 1` over tensor-parallel groups (FSDP2 x TP, torchtitan's 2D layout: GPT-2 split as megatron splits it, the
embedding and head by vocabulary, with `sequence_parallel` the LayerNorms and residual stream by sequence, then each
unit sharded over the `workers / tp` replicas); with `cp > 1` each sequence split over context-parallel ranks
(FSDP2 x CP, `suite.strategies.context_parallel`), each unit sharded over the data x context ranks, as torchtitan
shards over its `dp_shard_cp` mesh.

Each layer of the network (a GPT-2 block, a ResNet block, a VGG convolution; `suite.models.layers`)
is its own unit, gathered just before it runs; the root unit holds what is left (GPT-2's embeddings,
final LayerNorm and the tied head, which must share a unit). `reshard_after_forward` true frees a block's
gathered parameters after its forward and gathers them again for backward (ZeRO-3-like); false keeps them
until the step (ZeRO-2-like: optimizer states and gradients sharded, parameters whole during a step).

Wrapped as torchtitan wraps a transformer (torchtitan/models/llama3/infra/parallelize.py `apply_fsdp`):
- the root is left at `fully_shard`'s default, `reshard_after_forward=None`, which FSDP2 resolves to False for the
  root (its docstring: "For best performance, we usually set False for the root module, because the root module is
  typically required immediately when the backward pass begins"); torchtitan keeps [norm, output] resident the same
  way, which here is the root (the head is tied to the embedding). The knob sets the blocks only;
- in bf16 and fp16, `MixedPrecisionPolicy(param_dtype=<bf16|fp16>, reduce_dtype=fp32)` on every unit, torchtitan's
  (`mixed_precision_param` bfloat16, `mixed_precision_reduce` float32): parameters are all-gathered in half
  precision (half the bytes) and gradients reduce-scattered in fp32 into the fp32 shards the optimizer steps. The
  step's torch autocast stays on, as for every strategy, so the ops autocast keeps in fp32 (LayerNorm, softmax, the
  loss) still run in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout, divisors
from suite.models.layers import block_layers
from suite.runtime.numerics import build_optimizer
from suite.runtime.torch_api import fsdp_param_groups
from suite.shared_names import ELEMENTWISE_OPTIMIZERS, Family
from suite.strategies.base import DataParallel, RankContext, Sharding, Strategy, Supports
from suite.strategies.context_parallel import SequenceShard, apply_context_parallel, check_context_split, replica_mesh
from suite.strategies.megatron import apply_tensor_parallel, check_tensor_split, whole_sequence_logits


@dataclass(frozen=True)
class FSDP(Strategy):
    name: str = "fsdp"
    family: ClassVar[Family] = Family.sharded
    label: ClassVar[str] = "FSDP"
    # Parameters are sharded: only element-wise updates are right on a shard.
    # Gradient accumulation reduce-scatters every micro-batch's gradients into the fp32 shards, as Composer (LLM
    # Foundry) runs FSDP: no unsharded gradients are held between micro-batches.
    supports: ClassVar[Supports] = Supports(counts_communication=True, optimizers=ELEMENTWISE_OPTIMIZERS,
                                            grad_accum=True, fp8=True, compile=True)
    # FSDP2's torch.distributed.fsdp.fully_shard is public from torch 2.6 (2.4 had it private, in _composable).
    needs_torch: ClassVar[str] = "2.6"
    reshard_after_forward: bool = True
    tp: int = 1  # tensor-parallel ranks splitting GPT-2 as megatron does, sharded over the workers / tp replicas
    sequence_parallel: bool = False  # with tp > 1: megatron's sequence parallelism inside each tensor-parallel group
    cp: int = 1  # context-parallel ranks splitting each sequence (Llama), sharded over with the replicas

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        """Resharding after forward or not, FSDP2 x TP (torchtitan's 2D layout) with every tp > 1 dividing the
        workers, with and without sequence parallelism, and FSDP2 x CP with every cp > 1 dividing them (the network's
        check keeps those it can split)."""
        return ([[f"strategy.reshard_after_forward={keep}"] for keep in ("true", "false")]
                + [[f"strategy.tp={tp}", *sp] for tp in divisors(workers) if tp > 1
                   for sp in ([], ["strategy.sequence_parallel=true"])]
                + [[f"strategy.cp={cp}"] for cp in divisors(workers) if cp > 1])

    def check(self, cfg) -> None:
        check_tensor_split(self.name, cfg, self.tp, cfg.workers, self.sequence_parallel)
        check_context_split(self.name, cfg, self.cp, cfg.workers // self.tp)
        if self.tp > 1 and cfg.fp8 != "none":
            raise ConfigError(f"strategy fsdp: tp={self.tp} with fp8={cfg.fp8} is not run here (torchtitan splits fp8 "
                              "linear layers with float8 tensor-parallel plans); use tp=1")
        if self.tp > 1 and cfg.precision == "fp16":
            raise ConfigError(f"strategy fsdp: tp={self.tp} has no fp16 loss scaling over its 2D-sharded gradients; "
                              "use precision=bf16 (or fp32)")

    def sharding(self, cfg) -> Sharding:
        """Every parameter sharded (ZeRO-3's), gathered in half precision under bf16 or fp16 (torchtitan's
        `param_dtype`), gathered again for backward with `reshard_after_forward`; the root unit stays gathered."""
        return Sharding(3, gathered_share=0.5 if cfg.precision in HALF else 1.0, regathers=self.reshard_after_forward)

    def layout(self, cfg) -> Layout:
        """`workers / (cp tp)` replicas, each a group of cp x tp ranks training on its `batch_size` samples; the
        parameters are sharded over the replicas' context-parallel ranks (every rank of a tensor-parallel index)."""
        replicas = cfg.workers // (self.tp * self.cp)
        return replace(super().layout(cfg), dp=replicas, tp=self.tp, cp=self.cp, shard=replicas * self.cp)

    def setup(self, model: nn.Module, rank: RankContext) -> DataParallel:
        from torch.distributed.fsdp import fully_shard  # here: the module imports on torch before 2.6

        model = model.to(rank.env.device)
        mesh = rank.layout.mesh(rank.env.device.type)
        if self.tp > 1:  # torchtitan's order: tensor parallelism first, then FSDP over the data-parallel mesh
            apply_tensor_parallel(model, mesh["tp"], vocab_parallel=True, sequence_parallel=self.sequence_parallel)
        sequence = apply_context_parallel(model, mesh, rank.layout, rank.env.rank)
        shard_mesh = replica_mesh(mesh, rank.layout)
        policy = mixed_precision_policy(rank.cfg.precision)
        for layer in block_layers(model):
            fully_shard(layer.module, mesh=shard_mesh, reshard_after_forward=self.reshard_after_forward,
                        mp_policy=policy)
        model = fully_shard(model, mesh=shard_mesh, mp_policy=policy)  # the root: not resharded (torch's default)
        return FSDPRuntime(rank, model, build_optimizer(model.parameters(), rank.cfg.optimizer), mesh["tp"].get_group(),
                           sequence)


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(precision: str):
    """torchtitan's policy for a point in bf16 or fp16: unsharded parameters (all-gather, forward and backward) in
    half precision, gradients reduced in fp32; FSDP2's default (everything in the parameters' fp32) in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in HALF:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=HALF[precision], reduce_dtype=torch.float32)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class FSDPRuntime(DataParallel):
    def __init__(self, rank: RankContext, model: nn.Module, optimizer: torch.optim.Optimizer, tp_group,
                 sequence: SequenceShard | None = None) -> None:
        super().__init__(rank, model, optimizer, sync_buffers=True)
        self.tp_group, self.sequence = tp_group, sequence
        self.split_logits = rank.layout.tp > 1  # the head split by vocabulary

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Under context parallelism, on this rank's part of each sequence; the loss returned is the group's."""
        if self.sequence is None:
            return super().train_step(inputs, targets)
        return self.sequence.train_on_part(super().train_step, inputs, targets)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Evaluation's forward, after which every unit is resharded: FSDP2 reshards the units it keeps gathered
        after forward (the root; every block with reshard_after_forward false) after their backward, and evaluation
        runs none, which would leave them gathered, held whole beside their shards, until the next step's backward."""
        from torch.distributed.fsdp import FSDPModule

        output = whole_sequence_logits(self.model, inputs, self.tp_group, self.rank.layout.tp, self.sequence)
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return output

    def effective_settings(self) -> dict[str, Any]:
        """What FSDP2 resolved for the root unit (whether it reshards after forward: the root's
        `reshard_after_forward=None` becomes False once FSDP2 finds it is the root, at the first forward) and the
        mixed-precision policy every unit runs with: the dtype parameters are gathered and computed in (a policy's
        None: the parameters' own) and the dtype gradients are reduced in (None: that compute dtype)."""
        root = self.model._get_fsdp_state()
        policy = root._mp_policy
        param_dtype = policy.param_dtype or next(self.plain.parameters()).dtype
        reduce_dtype = policy.reduce_dtype or param_dtype
        base = super().effective_settings()
        precision = base["precision.implementation"]
        if policy.param_dtype is not None:
            precision = (f"FSDP2 MixedPrecisionPolicy(param_dtype={dtype_name(param_dtype)}, "
                         f"reduce_dtype={dtype_name(reduce_dtype)}) + {precision}")
        return {**base,
                "precision.implementation": precision,
                "fsdp.root.reshard_after_forward": any(group.post_forward_mesh_info is not None
                                                       for group in fsdp_param_groups(root)),
                "fsdp.mp_policy.param_dtype": dtype_name(param_dtype),
                "fsdp.mp_policy.reduce_dtype": dtype_name(reduce_dtype)}
