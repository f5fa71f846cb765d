"""GPipe's schedule across ranks (one stage per rank, so it spans nodes): all micro-batches
forward, then all backward, then a flush (torch.distributed.pipelining.ScheduleGPipe)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.distributed.pipelining import ScheduleGPipe

from suite.strategies.base import RankContext
from suite.strategies.pipeline import DistributedPipeline
from suite.strategies.scheduled import Scheduled


@dataclass(frozen=True)
class GPipeDist(DistributedPipeline):
    name: str = "gpipe_dist"

    def setup(self, model: nn.Module, rank: RankContext) -> Scheduled:
        def schedule(stages, micro_batches, loss_fn):
            (stage,) = stages
            return ScheduleGPipe(stage, micro_batches, loss_fn=loss_fn)
        return Scheduled(self, model, rank, schedule)
