"""One process, one device: the reference every other strategy is checked against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from suite.errors import ConfigError
from suite.strategies.base import Strategy


@dataclass
class Single(Strategy):
    name: str = "single"
    counts_communication: ClassVar[bool] = True

    def check(self, cfg) -> None:
        if cfg.workers != 1:
            raise ConfigError(f"strategy single runs one process, but workers={cfg.workers}")
