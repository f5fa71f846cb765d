"""One-forward-one-backward with a flush per mini-batch (PipeDream-Flush, Megatron-LM's schedule):
the same math as GPipe with at most `stages` micro-batches of activations alive per stage.
`virtual_stages > 1` gives each rank that many model chunks (ScheduleInterleaved1F1B)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from suite.errors import BadValue, ConfigError
from suite.strategies.base import RankContext
from suite.strategies.pipeline import DistributedPipeline
from suite.vocabulary import Family

if TYPE_CHECKING:
    from suite.strategies.scheduled import Scheduled


@dataclass(frozen=True)
class OneFOneB(DistributedPipeline):
    name: str = "1f1b"
    family: ClassVar[Family] = Family.flushed_pipeline
    label: ClassVar[str] = "1F1B"
    needs_torch: ClassVar[str] = "2.6"  # see suite.strategies.scheduled
    virtual_stages: int = 1

    def chunks_per_device(self) -> int:
        return self.virtual_stages

    def check(self, cfg) -> None:
        if self.virtual_stages < 1:
            raise BadValue(f"strategy 1f1b: virtual_stages must be positive, got {self.virtual_stages}")
        super().check(cfg)
        stages, m = self.stages(cfg), self.batching(cfg).micro_batches
        if self.virtual_stages > 1 and m % stages:
            raise ConfigError(f"strategy 1f1b: interleaving needs micro_batches ({m}) divisible by the "
                              f"{stages} stages")

    def setup(self, model: nn.Module, rank: RankContext) -> Scheduled:
        from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B

        from suite.strategies.scheduled import Scheduled

        def schedule(stages, micro_batches, loss_fn):
            if self.virtual_stages > 1:
                return ScheduleInterleaved1F1B(stages, micro_batches, loss_fn=loss_fn)
            (stage,) = stages
            return Schedule1F1B(stage, micro_batches, loss_fn=loss_fn)
        return Scheduled(self, model, rank, schedule)
