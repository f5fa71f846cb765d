"""Asynchronous PipeDream with weight stashing (the engine is suite.pipeline.pipedream_engine).

One training step feeds one mini-batch (the point's `batch_size`, no micro-batches) into a pipeline
that never flushes between steps: on a stage with k stages after it, the step's backward belongs to
the mini-batch fed k steps earlier, and each backward updates that stage's weights. The pipeline is
drained at the end of each epoch, so evaluation sees every update. Staleness changes the math on
purpose; the statistical-efficiency curve (validation metric per epoch and against time) shows it.

`replicas=[2,1,1]` runs PipeDream's replicated stages: ranks per stage (they sum to the workers), the
stages' replicas taking the stream's mini-batches round-robin; one training step is then a round of
lcm(replicas) mini-batches (Layout.stage_replicas). `pp=auto` runs the configuration PipeDream's
planner chooses (suite.predict.pipedream_plan), resolved into `replicas` and `balance` when the sweep
is planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout, divisors
from suite.pipeline.microbatch import MicroBatching
from suite.pipeline.pipedream_engine import PipeDreamStage
from suite.shared_names import Family
from suite.strategies.base import RankContext
from suite.strategies.pipeline import DistributedPipeline, DistributedStages


class PipeDreamRuntime(DistributedStages):
    flushes = False  # no flush between steps: in steady state every stage alternates forward and backward
    p2p_channels = True

    def __init__(self, spec: DistributedPipeline, model: nn.Module, rank: RankContext) -> None:
        # GPT-2's embedding and LM head, tied in the other strategies, start equal and are then trained as two
        # copies, each by its own stage: the first and last stage reach a mini-batch's backward steps apart, and
        # a blocking sum between them would stall the pipeline.
        super().__init__(spec, model, rank, sum_tied=False)
        (module,) = self.model
        self.engine = PipeDreamStage(module, self.stage_ids[0], self.topology, self.optimizer, self.sync_grads,
                                     rank.env.device)

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """This rank's mini-batches of the step (its share of a round, with replicated stages); on the last stage
        its share of the step's mean loss, which the trainer sums over the ranks that hold the output."""
        layout = self.rank.layout
        inputs, targets = (t.chunk(layout.micro_batches) if t.numel() else [t] * layout.micro_batches
                           for t in (inputs, targets))
        losses = []
        with self.rank.timer.phase("pipeline"):
            for k in layout.runs(self.topology.position):
                losses.append(self.engine.step(inputs[k], targets[k], self.rank.loss_fn, self.rank.precision,
                                               self.rank.timer))
        if not self.holds_output:
            return torch.zeros((), device=self.rank.env.device)
        return torch.stack(losses).sum() / layout.micro_batches

    def finish_epoch(self) -> None:
        with self.rank.timer.phase("pipeline"):
            self.engine.drain(self.rank.timer)

    def summary_metrics(self, memory_by_rank: list[dict[str, float]]) -> dict[str, float]:
        metrics = super().summary_metrics(memory_by_rank)
        versions = [None] * dist.get_world_size()
        dist.all_gather_object(versions, (self.topology.stage_rank, self.engine.weight_versions_max))
        per_stage: dict[int, int] = {}
        for stage, count in versions:
            per_stage[stage] = max(per_stage.get(stage, 0), count)
        metrics.update({f"weight_versions_max_stage{s}": float(n) for s, n in sorted(per_stage.items())})
        metrics["weight_versions_max"] = float(max(per_stage.values()))
        return metrics


@dataclass(frozen=True)
class PipeDream(DistributedPipeline):
    name: str = "pipedream"
    family: ClassVar[Family] = Family.async_pipeline
    label: ClassVar[str] = "PipeDream"
    # Its process groups come from a device mesh with named dimensions (suite.pipeline.groups): init_device_mesh,
    # public from torch 2.2.
    needs_torch: ClassVar[str] = "2.2"
    accumulation_hint: ClassVar[str] = "PipeDream updates each stage's weights after every mini-batch"

    replicas: list[int] | None = None  # ranks per stage, PipeDream's 2-1-1 (None: pp stages, workers / pp each)
    pp: int | Literal["auto"] | None = None  # auto: the planner's configuration (resolved into replicas, balance)

    def batching(self, cfg) -> MicroBatching:
        return MicroBatching(1, cfg.batch_size)

    def stages(self, cfg) -> int:
        return len(self.replicas) if self.replicas else super().stages(cfg)

    def check_workers(self, cfg, stages: int) -> None:
        if self.pp == "auto" and self.replicas is None:
            raise ConfigError("strategy pipedream: pp=auto is chosen by PipeDream's planner, which this command does "
                              "not run (run, sweep, predict and status do)")
        if self.replicas is None:
            super().check_workers(cfg, stages)
        elif self.pp not in (None, "auto"):
            raise ConfigError(f"strategy pipedream: give pp or replicas, not both (replicas={self.replicas} is "
                              f"{len(self.replicas)} stages)")
        elif not self.replicas or min(self.replicas) < 1:
            raise ConfigError(f"strategy pipedream: replicas={self.replicas} leaves a stage without a rank")
        elif sum(self.replicas) != cfg.workers:
            raise ConfigError(f"strategy pipedream: replicas={self.replicas} puts {sum(self.replicas)} ranks on its "
                              f"stages, not the workers={cfg.workers}")

    def layout(self, cfg) -> Layout:
        if self.replicas is None:
            return super().layout(cfg)
        round_ = math.lcm(*self.replicas)
        return Layout(dp=1, pp=len(self.replicas), mini_batch=round_ * cfg.batch_size, micro_batches=round_,
                      stage_replicas=tuple(self.replicas))

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[f"strategy.pp={pp}"] for pp in divisors(workers) if pp > 1]

    def check(self, cfg) -> None:
        for knob in ("micro_batches", "micro_batch_size", "preset"):
            if getattr(self, knob) is not None:
                raise ConfigError(f"strategy pipedream has no {knob}: each step is one mini-batch of batch_size")
        super().check(cfg)

    def setup(self, model: nn.Module, rank: RankContext) -> PipeDreamRuntime:
        return PipeDreamRuntime(self, model, rank)
