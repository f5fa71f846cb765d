"""One process, one device: the reference every other strategy is checked against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from suite.errors import ConfigError
from suite.runtime.numerics import build_optimizer
from suite.shared_names import Family
from suite.strategies.base import DataParallel, RankContext, Strategy, Supports


@dataclass(frozen=True)
class Single(Strategy):
    name: str = "single"
    family: ClassVar[Family] = Family.replicated
    supports: ClassVar[Supports] = Supports(counts_communication=True, grad_accum=True, fp8=True, compile=True)

    @classmethod
    def candidates(cls, workers: int, batch: int) -> list[list[str]]:
        return [[]] if workers == 1 else []

    @classmethod
    def probes(cls) -> dict[str, list[str]]:
        return {cls.name: ["workers=1"]}

    def check(self, cfg) -> None:
        if cfg.workers != 1:
            raise ConfigError(f"strategy single runs one process, but workers={cfg.workers}")

    def setup(self, model: nn.Module, rank: RankContext) -> DataParallel:
        model = model.to(rank.env.device)
        return DataParallel(rank, model, build_optimizer(model.parameters(), rank.cfg.optimizer))
