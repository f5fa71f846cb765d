"""GPipe's schedule across ranks (one stage per rank, so it spans nodes): all micro-batches
forward, then all backward, then a flush (torch.distributed.pipelining.ScheduleGPipe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from suite.strategies.base import RankContext
from suite.strategies.pipeline import DistributedPipeline
from suite.vocabulary import Family

if TYPE_CHECKING:
    from suite.strategies.scheduled import Scheduled


@dataclass(frozen=True)
class GPipeDist(DistributedPipeline):
    name: str = "gpipe_dist"
    family: ClassVar[Family] = Family.flushed_pipeline
    label: ClassVar[str] = "GPipe-dist"
    needs_torch: ClassVar[str] = "2.6"  # see suite.strategies.scheduled
    forwards_all_first: ClassVar[bool] = True

    def setup(self, model: nn.Module, rank: RankContext) -> Scheduled:
        from torch.distributed.pipelining import ScheduleGPipe

        from suite.strategies.scheduled import Scheduled

        def schedule(stages, micro_batches, loss_fn):
            (stage,) = stages
            return ScheduleGPipe(stage, micro_batches, loss_fn=loss_fn)
        return Scheduled(self, model, rank, schedule)
