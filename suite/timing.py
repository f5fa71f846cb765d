"""Synchronised wall-clock timers for the phases of a training step."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

import torch

PHASES = ("data", "forward", "backward", "optimizer")


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so that a clock read covers it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Accumulates seconds per phase over the steps taken while `enabled` (warm-up steps are not)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.enabled = False
        self.totals: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.totals[name] += time.perf_counter() - start

    def means(self) -> dict[str, float]:
        """Mean seconds per timed step for each phase."""
        return {p: self.totals[p] / self.steps for p in PHASES if self.steps}
