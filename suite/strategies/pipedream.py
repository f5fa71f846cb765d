"""Asynchronous PipeDream with weight stashing (the engine is suite.pipeline.pipedream).

One training step feeds one mini-batch (the point's `batch_size`, no micro-batches) into a pipeline
that never flushes between steps: on a stage with k stages after it, the step's backward belongs to
the mini-batch fed k steps earlier, and each backward updates that stage's weights. The pipeline is
drained at the end of each epoch, so evaluation sees every update. Staleness changes the math on
purpose; the statistical-efficiency curve (validation metric per epoch and against time) shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from suite.dist import DistEnv
from suite.errors import ConfigError
from suite.pipeline.microbatch import MicroBatching
from suite.pipeline.pipedream import PipeDreamStage
from suite.precision import Precision
from suite.strategies.base import LossFn
from suite.strategies.pipeline import DistributedPipeline
from suite.timing import PhaseTimer


@dataclass
class PipeDream(DistributedPipeline):
    name: str = "pipedream"

    def batching(self, cfg) -> MicroBatching:
        return MicroBatching(1, cfg.batch_size)

    def check(self, cfg) -> None:
        for knob in ("micro_batches", "micro_batch_size", "preset"):
            if getattr(self, knob) is not None:
                raise ConfigError(f"strategy pipedream has no {knob}: each step is one mini-batch of batch_size")
        super().check(cfg)

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                   targets: torch.Tensor, loss_fn: LossFn, precision: Precision, timer: PhaseTimer) -> torch.Tensor:
        if not hasattr(self, "engine"):
            (module,) = model
            self.engine = PipeDreamStage(module, self.stage_ids[0], self.topology, optimizer, self.sync_grads,
                                         self.device)
        self.timer = timer
        with timer.phase("pipeline"):
            loss = self.engine.step(inputs, targets, loss_fn, precision, timer)
        return loss if loss is not None else torch.zeros((), device=inputs.device)

    def finish_epoch(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with self.timer.phase("pipeline"):
            self.engine.drain(self.timer)

    def sums_tied_gradients(self) -> bool:
        """No: the first and last stage reach a mini-batch's backward steps apart, and a blocking sum
        between them would stall the pipeline. GPT-2's embedding and LM head, tied in the other
        strategies, start equal and are then trained as two copies, each by its own stage."""
        return False

    def ideal_bubble(self, devices: int) -> float:
        return 0.0  # no flush: in steady state every stage alternates forward and backward without waiting

    def step_bound(self, all_stages_s: float, busiest_s: float, devices: int) -> float:
        return busiest_s  # steady state: one mini-batch per step of the slowest stage

    def summary_metrics(self, timer: PhaseTimer, memory_by_rank: list[dict[str, float]],
                        env: DistEnv) -> dict[str, float]:
        metrics = super().summary_metrics(timer, memory_by_rank, env)
        versions = [None] * env.world_size
        dist.all_gather_object(versions, (self.topology.stage_rank, self.engine.weight_versions_max))
        per_stage: dict[int, int] = {}
        for stage, count in versions:
            per_stage[stage] = max(per_stage.get(stage, 0), count)
        metrics.update({f"weight_versions_max_stage{s}": float(n) for s, n in sorted(per_stage.items())})
        metrics["weight_versions_max"] = float(max(per_stage.values()))
        return metrics
