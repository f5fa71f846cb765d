"""Fully sharded data parallelism with torch FSDP2 (`fully_shard`), one unit per layer plus the root.

Each layer of the network (a GPT-2 block, a ResNet block, a VGG convolution; `suite.models.layers`)
is its own unit, gathered just before it runs; the root unit holds what is left (GPT-2's embeddings,
final LayerNorm and the tied head). `reshard_after_forward` true frees a unit's gathered parameters
after its forward and gathers them again for backward (ZeRO-3-like); false keeps them until the
step (ZeRO-2-like: optimizer states and gradients sharded, parameters whole during a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from suite.layout import Layout
from suite.models.layers import block_layers
from suite.runtime.optim import build_optimizer
from suite.strategies.base import DataParallel, RankContext, Strategy, Supports
from suite.vocabulary import ELEMENTWISE_OPTIMIZERS, Family


@dataclass(frozen=True)
class FSDP(Strategy):
    name: str = "fsdp"
    family: ClassVar[Family] = Family.sharded
    label: ClassVar[str] = "FSDP"
    # Parameters are sharded: only element-wise updates are right on a shard.
    supports: ClassVar[Supports] = Supports(counts_communication=True, optimizers=ELEMENTWISE_OPTIMIZERS)
    # FSDP2's torch.distributed.fsdp.fully_shard is public from torch 2.6 (2.4 had it private, in _composable).
    needs_torch: ClassVar[str] = "2.6"
    reshard_after_forward: bool = True

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[f"strategy.reshard_after_forward={keep}"] for keep in ("true", "false")]

    def layout(self, cfg) -> Layout:
        return Layout(dp=cfg.workers, mini_batch=cfg.batch_size, shard=cfg.workers)

    def setup(self, model: nn.Module, rank: RankContext) -> DataParallel:
        from torch.distributed.fsdp import fully_shard  # here: the module imports on torch before 2.6

        model = model.to(rank.env.device)
        mesh = rank.layout.mesh(rank.env.device.type)["dp"]
        for layer in block_layers(model):
            fully_shard(layer.module, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        model = fully_shard(model, mesh=mesh, reshard_after_forward=self.reshard_after_forward)
        return DataParallel(rank, model, build_optimizer(model.parameters(), rank.cfg.optimizer), sync_buffers=True)
