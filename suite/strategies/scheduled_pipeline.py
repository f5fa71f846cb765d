"""Synchronous pipelines across processes on torch.distributed.pipelining: one schedule step per
mini-batch (all its micro-batches), gradients averaged over micro-batches, a flush, then one
optimizer step. `gpipe_dist` and `1f1b` differ only in the schedule class."""

from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from suite.dist import DistEnv
from suite.precision import Precision
from suite.strategies.base import LossFn
from suite.strategies.pipeline import DistributedPipeline
from suite.timing import PhaseTimer


@dataclass
class ScheduledPipeline(DistributedPipeline):
    name: str = "scheduled_pipeline"

    def make_schedule(self, stages: list[PipelineStage], micro_batches: int, loss_fn: LossFn):
        raise NotImplementedError

    def parallelize(self, model: nn.Module, env: DistEnv, cfg) -> nn.Module:
        local = super().parallelize(model, env, cfg)
        self.timer: PhaseTimer | None = None
        self.pipeline_stages = []
        for module, index in zip(local, self.stage_ids):
            stage = PipelineStage(module, index, self.total_stages, env.device, group=self.topology.pipe_group)
            stage.forward_one_chunk = self._timed(stage.forward_one_chunk, "forward", f"stage{index}.forward")
            stage.backward_one_chunk = self._timed(stage.backward_one_chunk, "backward", f"stage{index}.backward")
            self.pipeline_stages.append(stage)
        self.schedule = None
        return local

    def _timed(self, method, *phases: str):
        @wraps(method)
        def timed(*args, **kwargs):
            with self.timer.phase(*phases):
                return method(*args, **kwargs)
        return timed

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                   targets: torch.Tensor, loss_fn: LossFn, precision: Precision, timer: PhaseTimer) -> torch.Tensor:
        if self.schedule is None:
            self.schedule = self.make_schedule(self.pipeline_stages, self._micro_batches, loss_fn)
        self.timer = timer
        losses: list[torch.Tensor] = []
        topo = self.topology
        with timer.phase("pipeline"):
            with precision.autocast():
                args = (inputs,) if topo.is_first else ()
                kwargs = {"target": targets, "losses": losses} if topo.is_last else {}
                self.schedule.step(*args, **kwargs)
            self.sync_grads()
        with timer.phase("optimizer"):
            precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        if not losses:
            return torch.zeros((), device=inputs.device)
        return torch.stack([loss.detach().float() for loss in losses]).mean()
