"""Synchronous pipelines across ranks on torch.distributed.pipelining: one schedule step per mini-batch
(all its micro-batches), gradients averaged over micro-batches, a flush, then one optimizer step.
`gpipe_dist` and `1f1b` differ only in the schedule class they hand to `Scheduled` (their `build_schedule`), and
suite.strategies.scheduled_pipeline.ScheduledPipeline imports this module in their `setup`: torch.distributed.pipelining
came with torch 2.4, but a PipelineStage built without example inputs (shapes found on the first micro-batch,
pytorch#136912), as here, only with torch 2.6, which they declare."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from suite.runtime.metrics import local_tensor
from suite.runtime.numerics import AutocastForward, Precision
from suite.strategies.base import LossFn, RankContext
from suite.strategies.pipeline import DistributedPipeline, DistributedStages

log = logging.getLogger("suite")

# (this rank's PipelineStages, micro-batches, loss) -> a schedule of torch.distributed.pipelining
ScheduleFactory = Callable[[list[PipelineStage], int, LossFn], object]


def autocast_loss(loss_fn: LossFn, precision: Precision) -> LossFn:
    """`loss_fn` in `precision`'s autocast, as every other strategy computes its loss (the schedule calls it on
    the last stage after the stage's forward)."""
    @wraps(loss_fn)
    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with precision.autocast():
            return loss_fn(outputs, targets)
    return loss


def p2p_per_direction() -> bool:
    """Make the stages built from now on in this process send activations and gradients on communicators of their
    own, where this torch has the option (`torch.distributed.config.pipeline_per_direction_p2p`; it splits a
    device-bound process group, which NCCL ranks have, and gloo's is not). On one NCCL communicator the sends and
    receives of both directions queue in one order, which interleaved and zero-bubble schedules can make wait on
    each other across stages (torch's own warning in `pipelining/stage.py`). Whether this torch could."""
    try:
        from torch.distributed import config
    except ImportError:
        return False
    if not hasattr(config, "pipeline_per_direction_p2p"):
        return False
    config.pipeline_per_direction_p2p = True
    return True


class Scheduled(DistributedStages):
    def __init__(self, spec: DistributedPipeline, model: nn.Module, rank: RankContext,
                 make_schedule: ScheduleFactory) -> None:
        super().__init__(spec, model, rank, sum_tied=True)
        if rank.env.backend == "nccl" and not p2p_per_direction():
            log.warning("torch %s has no per-direction pipeline communicators: activations and gradients share one "
                        "NCCL communicator per stage pair (a schedule that interleaves them may wait forever)",
                        torch.__version__)
        stages = []
        for module, index in zip(self.model, self.stage_ids):
            # The stage's module itself enters the autocast (not its forward_one_chunk), so that the forward torch runs
            # to infer the shapes and dtypes sent between stages computes in the micro-batches' dtype.
            stage = PipelineStage(AutocastForward(module, rank.precision), index, self.total_stages, rank.env.device,
                                  group=self.topology.pipe_group)
            # PipelineStage has no hook around one micro-batch's forward or backward: its methods are wrapped.
            stage.forward_one_chunk = self._timed(stage.forward_one_chunk, "forward", f"stage{index}.forward")
            stage.backward_one_chunk = self._timed(stage.backward_one_chunk, "backward", f"stage{index}.backward")
            # a zero-bubble schedule's weights' gradients, computed apart from the inputs' (backward_one_chunk's)
            stage.backward_weight_one_chunk = self._timed(stage.backward_weight_one_chunk, "backward",
                                                          f"stage{index}.backward")
            stages.append(stage)
        self.schedule = make_schedule(stages, rank.layout.micro_batches, autocast_loss(rank.loss_fn, rank.precision))

    def _timed(self, method, *phases: str):
        @wraps(method)
        def timed(*args, **kwargs):
            with self.rank.timer.phase(*phases):
                return method(*args, **kwargs)
        return timed

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        topo, timer = self.topology, self.rank.timer
        with timer.phase("pipeline"), self.loss_context():
            args = (inputs,) if topo.is_first else ()
            kwargs = {"target": targets, "losses": losses} if topo.is_last else {}
            self.schedule.step(*args, **kwargs)
            self.sync_grads()
        with timer.phase("optimizer"):
            self.optimizer_step()
        if not losses:
            return torch.zeros((), device=inputs.device)
        return torch.stack([local_tensor(loss).detach().float() for loss in losses]).mean()
