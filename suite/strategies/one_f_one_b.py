"""One-forward-one-backward with a flush per mini-batch (PipeDream-Flush, Megatron-LM's schedule):
the same math as GPipe with at most `stages` micro-batches of activations alive per stage.
`virtual_stages > 1` gives each rank that many model chunks (ScheduleInterleaved1F1B)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from suite.errors import BadValue, ConfigError
from suite.strategies.base import LossFn
from suite.strategies.scheduled_pipeline import ScheduledPipeline


@dataclass(frozen=True)
class OneFOneB(ScheduledPipeline):
    name: str = "1f1b"
    label: ClassVar[str] = "1F1B"
    virtual_stages: int = 1

    def chunks_per_device(self) -> int:
        return self.virtual_stages

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        flat = super().candidates(workers, batch)
        return flat + [[*knobs, "strategy.virtual_stages=2"] for knobs in flat]

    def check(self, cfg) -> None:
        if self.virtual_stages < 1:
            raise BadValue(f"strategy 1f1b: virtual_stages must be positive, got {self.virtual_stages}")
        super().check(cfg)
        stages, m = self.stages(cfg), self.batching(cfg).micro_batches
        if self.virtual_stages > 1 and m % stages:
            raise ConfigError(f"strategy 1f1b: interleaving needs micro_batches ({m}) divisible by the "
                              f"{stages} stages")

    def schedule(self, stages: list, micro_batches: int, loss_fn: LossFn):
        from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B

        if self.virtual_stages > 1:
            return ScheduleInterleaved1F1B(stages, micro_batches, loss_fn=loss_fn)
        (stage,) = stages
        return Schedule1F1B(stage, micro_batches, loss_fn=loss_fn)
