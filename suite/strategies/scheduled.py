"""Synchronous pipelines across ranks on torch.distributed.pipelining: one schedule step per mini-batch
(all its micro-batches), gradients averaged over micro-batches, a flush, then one optimizer step.
`gpipe_dist` and `1f1b` differ only in the schedule class they hand to `Scheduled`, and import this module in
their `setup`: torch.distributed.pipelining came with torch 2.4, but a PipelineStage built without example inputs
(shapes found on the first micro-batch, pytorch#136912), as here, only with torch 2.6, which they declare."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from suite.strategies.base import LossFn, RankContext
from suite.strategies.pipeline import DistributedPipeline, DistributedStages

# (this rank's PipelineStages, micro-batches, loss) -> a schedule of torch.distributed.pipelining
ScheduleFactory = Callable[[list[PipelineStage], int, LossFn], object]


class Scheduled(DistributedStages):
    def __init__(self, spec: DistributedPipeline, model: nn.Module, rank: RankContext,
                 make_schedule: ScheduleFactory) -> None:
        super().__init__(spec, model, rank, sum_tied=True)
        stages = []
        for module, index in zip(self.model, self.stage_ids):
            stage = PipelineStage(module, index, self.total_stages, rank.env.device, group=self.topology.pipe_group)
            # PipelineStage has no hook around one micro-batch's forward or backward: its methods are wrapped.
            stage.forward_one_chunk = self._timed(stage.forward_one_chunk, "forward", f"stage{index}.forward")
            stage.backward_one_chunk = self._timed(stage.backward_one_chunk, "backward", f"stage{index}.backward")
            stages.append(stage)
        self.schedule = make_schedule(stages, rank.layout.micro_batches, rank.loss_fn)

    def _timed(self, method, *phases: str):
        @wraps(method)
        def timed(*args, **kwargs):
            with self.rank.timer.phase(*phases):
                return method(*args, **kwargs)
        return timed

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        topo, timer = self.topology, self.rank.timer
        with timer.phase("pipeline"):
            with self.rank.precision.autocast():
                args = (inputs,) if topo.is_first else ()
                kwargs = {"target": targets, "losses": losses} if topo.is_last else {}
                self.schedule.step(*args, **kwargs)
            self.sync_grads()
        with timer.phase("optimizer"):
            self.optimizer_step()
        if not losses:
            return torch.zeros((), device=inputs.device)
        return torch.stack([loss.detach().float() for loss in losses]).mean()
