"""The spec of a flushed pipeline across ranks that a torch.distributed.pipelining schedule runs (`gpipe_dist`,
`1f1b`): each names its schedule; suite.strategies.scheduled, imported in `setup` (it needs torch 2.6, which these
declare), runs it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from torch import nn

from suite.strategies.base import LossFn, RankContext, Runtime, Supports
from suite.strategies.pipeline import DistributedPipeline
from suite.vocabulary import Family


@dataclass(frozen=True)
class ScheduledPipeline(DistributedPipeline):
    """A flushed pipeline that a torch.distributed.pipelining schedule runs (suite.strategies.scheduled, imported
    in `setup`: it needs torch 2.6, which these declare)."""

    name: str = "scheduled_pipeline"
    family: ClassVar[Family] = Family.flushed_pipeline
    # A stage's checkpointed blocks recompute in its backward (Megatron-LM's 1F1B with recomputation); PipeDream,
    # whose backward runs on stashed weights, does not take it.
    supports: ClassVar[Supports] = replace(DistributedPipeline.supports, activation_checkpointing=True)
    needs_torch: ClassVar[str] = "2.6"

    def build_schedule(self, stages: list, micro_batches: int, loss_fn: LossFn):
        """The schedule of this rank's stages (its one stage, or its `virtual_stages` chunks)."""
        raise NotImplementedError

    def setup(self, model: nn.Module, rank: RankContext) -> Runtime:
        from suite.strategies.scheduled import Scheduled

        return Scheduled(self, model, rank, self.build_schedule)
