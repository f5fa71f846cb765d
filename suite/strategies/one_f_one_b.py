"""One-forward-one-backward with a flush per mini-batch (PipeDream-Flush, Megatron-LM's schedule):
the same math as GPipe with at most `stages` micro-batches of activations alive per stage.
`virtual_stages > 1` gives each rank that many model chunks (ScheduleInterleaved1F1B). `schedule=zero_bubble`
splits each backward into the inputs' gradient, sent on at once, and the weights', run where 1F1B would wait
(torch's ScheduleInterleavedZeroBubble: ZB1P of Qi et al., arXiv 2401.10241), with or without chunks. `zbv`
(ScheduleZBVZeroBubble, Qi et al.'s ZB-V) and `dualpipev` (ScheduleDualPipeV, DeepSeek-V3's DualPipe on half the
ranks) run two chunks a rank placed in a V: rank r holds chunks r and 2 pp - 1 - r, so the first and last chunks
(GPT-2's tied embedding and head) share rank 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from suite.errors import BadValue, ConfigError
from suite.strategies.base import LossFn
from suite.strategies.scheduled_pipeline import ScheduledPipeline

V_SCHEDULES = {"zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}  # two chunks a rank, in a V
V_SHAPED = tuple(V_SCHEDULES)
ZERO_BUBBLE = ("zero_bubble", "zbv", "dualpipev")  # the weights' gradients fill the bubble


@dataclass(frozen=True)
class OneFOneB(ScheduledPipeline):
    name: str = "1f1b"
    label: ClassVar[str] = "1F1B"
    virtual_stages: int = 1
    schedule: Literal["1f1b", "zero_bubble", "zbv", "dualpipev"] = "1f1b"

    @property
    def v_shaped(self) -> bool:
        return self.schedule in V_SHAPED

    @property
    def fills_bubble(self) -> bool:
        return self.schedule in ZERO_BUBBLE

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
        if self.v_shaped:
            from torch.distributed import pipelining

            if self.virtual_stages != 2:
                raise ConfigError(f"strategy 1f1b: schedule={self.schedule} runs two chunks a rank, in a V: set "
                                  f"strategy.virtual_stages=2 (not {self.virtual_stages})")
            if not hasattr(pipelining, V_SCHEDULES[self.schedule]):
                raise ConfigError(f"strategy 1f1b: schedule={self.schedule} needs torch's "
                                  f"{V_SCHEDULES[self.schedule]}, which torch {torch.__version__} lacks")
        if self.schedule == "dualpipev" and m < 2 * stages:
            raise ConfigError(f"strategy 1f1b: schedule=dualpipev needs at least as many micro-batches as chunks, "
                              f"{2 * stages}; micro_batches={m}")
        if self.virtual_stages > 1 and not self.v_shaped and m % stages:
            raise ConfigError(f"strategy 1f1b: interleaving needs micro_batches ({m}) divisible by the "
                              f"{stages} stages")

    @property
    def fill_share(self) -> float:
        """Zero bubble: a fill slot costs the forward only (ZB-H1's (p - 1)(T_F + T_B - T_W), with the forward, the
        inputs' and the weights' gradients taking equal time: a third of a micro-batch's work)."""
        return 1 / 3 if self.schedule in ZERO_BUBBLE else 1.0

    def build_schedule(self, stages: list, micro_batches: int, loss_fn: LossFn):
        from torch.distributed import pipelining

        if self.v_shaped:
            return getattr(pipelining, V_SCHEDULES[self.schedule])(stages, micro_batches, loss_fn=loss_fn)
        if self.schedule == "zero_bubble":
            return pipelining.ScheduleInterleavedZeroBubble(stages, micro_batches, loss_fn=loss_fn)
        if self.virtual_stages > 1:
            return pipelining.ScheduleInterleaved1F1B(stages, micro_batches, loss_fn=loss_fn)
        (stage,) = stages
        return pipelining.Schedule1F1B(stage, micro_batches, loss_fn=loss_fn)
