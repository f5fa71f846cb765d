"""GPipe's schedule across processes (one stage per rank, so it spans nodes): all micro-batches
forward, then all backward, then a flush (torch.distributed.pipelining.ScheduleGPipe)."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.pipelining import ScheduleGPipe

from suite.strategies.scheduled_pipeline import ScheduledPipeline


@dataclass
class GPipeDist(ScheduledPipeline):
    name: str = "gpipe_dist"

    def make_schedule(self, stages, micro_batches, loss_fn):
        (stage,) = stages
        return ScheduleGPipe(stage, micro_batches, loss_fn=loss_fn)
