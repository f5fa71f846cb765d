"""GPipe's schedule across ranks (one stage per rank, so it spans nodes): all micro-batches
forward, then all backward, then a flush (torch.distributed.pipelining.ScheduleGPipe)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from suite.strategies.base import LossFn
from suite.strategies.scheduled_pipeline import ScheduledPipeline


@dataclass(frozen=True)
class GPipeDist(ScheduledPipeline):
    name: str = "gpipe_dist"
    label: ClassVar[str] = "GPipe-dist"
    forwards_all_first: ClassVar[bool] = True

    def build_schedule(self, stages: list, micro_batches: int, loss_fn: LossFn):
        from torch.distributed.pipelining import ScheduleGPipe

        (stage,) = stages
        return ScheduleGPipe(stage, micro_batches, loss_fn=loss_fn)
