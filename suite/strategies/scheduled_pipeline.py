"""The spec of a flushed pipeline across ranks that a torch.distributed.pipelining schedule runs (`gpipe_dist`,
`1f1b`): each names its schedule; suite.strategies.scheduled_runtime, imported in `setup` (it needs torch 2.6, which
these declare), runs it. With `tp > 1` each stage is `tp` ranks that split its GPT-2 blocks as `megatron` does
(Megatron-LM's 3D layout: data x pipeline x tensor parallelism, `workers / (pp x tp)` replicas), the embedding and
the head by vocabulary, the logits left split for the loss (`megatron`'s vocab_parallel); with `sequence_parallel` the
LayerNorms and residual stream by sequence, and the stages send each other slices of the sequence."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from torch import nn

from suite.errors import ConfigError
from suite.layout import Layout, divisors
from suite.shared_names import Family
from suite.strategies.base import LossFn, RankContext, Runtime, Supports
from suite.strategies.megatron import check_tensor_split
from suite.strategies.pipeline import DistributedPipeline


@dataclass(frozen=True)
class ScheduledPipeline(DistributedPipeline):
    """A flushed pipeline that a torch.distributed.pipelining schedule runs (suite.strategies.scheduled_runtime,
    imported in `setup`: it needs torch 2.6, which these declare)."""

    name: str = "scheduled_pipeline"
    family: ClassVar[Family] = Family.flushed_pipeline
    # A stage's checkpointed blocks recompute in its backward (Megatron-LM's 1F1B with recomputation); PipeDream,
    # whose backward runs on stashed weights, does not take it.
    supports: ClassVar[Supports] = replace(DistributedPipeline.supports, activation_checkpointing=True)
    needs_torch: ClassVar[str] = "2.6"
    tp: int = 1  # tensor-parallel ranks per stage
    sequence_parallel: bool = False  # with tp > 1: megatron's sequence parallelism in each stage
    cp: int = 1  # context parallelism: not with pipeline stages here (the knob names it in a grid beside fsdp's)

    @classmethod
    def probes(cls) -> dict[str, list[str]]:
        return {cls.name: ["strategy.micro_batches=4"]}

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        """Every pipeline of the flat ones, and each again with its stages split over tp ranks (Megatron-LM's 3D
        layouts: every tp > 1 dividing the workers that leaves two stages or more)."""
        return super().candidates(workers, batch) + [
            [f"strategy.pp={pp}", f"strategy.tp={tp}", f"strategy.micro_batches={m}"]
            for tp in divisors(workers) if tp > 1
            for pp in divisors(workers // tp) if pp > 1 for m in cls.micro_batch_counts(pp, batch)]

    def stages(self, cfg) -> int:
        return self.pp or cfg.workers // max(self.tp, 1)

    def check(self, cfg) -> None:
        check_tensor_split(self.name, cfg, self.tp, cfg.workers, self.sequence_parallel)
        if self.cp != 1:
            raise ConfigError(f"strategy {self.name}: cp={self.cp}: context parallelism is not run with pipeline "
                              "stages here (a stage sends whole sequences); use strategy=fsdp or megatron with "
                              "strategy.cp")
        if self.tp > 1 and self.stages(cfg) == 1:
            raise ConfigError(f"strategy {self.name}: tp={self.tp} in one stage is tensor parallelism alone: use "
                              "strategy=megatron")
        if cfg.workers % (self.stages(cfg) * self.tp):
            raise ConfigError(f"strategy {self.name}: workers={cfg.workers} do not form pipelines of "
                              f"{self.stages(cfg)} stages x tp={self.tp}")
        super().check(cfg)

    def layout(self, cfg) -> Layout:
        layout = super().layout(cfg)
        return replace(layout, dp=layout.dp // self.tp, tp=self.tp)

    def build_schedule(self, stages: list, micro_batches: int, loss_fn: LossFn):
        """The schedule of this rank's stages (its one stage, or its `virtual_stages` chunks)."""
        raise NotImplementedError

    def setup(self, model: nn.Module, rank: RankContext) -> Runtime:
        from suite.strategies.scheduled_runtime import Scheduled

        return Scheduled(self, model, rank, self.build_schedule)
