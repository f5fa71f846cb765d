"""Wall-clock timers for the phases of a training step.

On CPU a phase is timed with the host clock. On GPU it is timed with CUDA events on the current
stream, read once per epoch after the epoch's final synchronisation, so timing a phase never
stalls the host from queueing work ahead (the epoch clock stays that of an uninstrumented loop).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

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
        self.pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.steps = 0
        # While a profiler records (suite.runtime.profile): a named range around each timed phase.
        self.ranges: Callable[[str], AbstractContextManager] | None = None

    @contextmanager
    def phase(self, *names: str) -> Iterator[None]:
        """Time the block under each of `names` (e.g. "forward" and the pipeline stage's own name); while a
        profiler records, the block is also a range named by the first."""
        if not self.enabled:
            yield
            return
        with self.ranges(names[0]) if self.ranges else nullcontext():
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                yield
                end.record()
                self.pending += [(name, start, end) for name in names]
            else:
                start_s = time.perf_counter()
                yield
                self.add(time.perf_counter() - start_s, *names)

    def add(self, seconds: float, *names: str) -> None:
        """Count host-clock seconds measured around work that `phase` cannot enclose (module hooks)."""
        if self.enabled:
            for name in names:
                self.totals[name] += seconds

    def collect(self) -> None:
        """Fold the recorded CUDA events into the totals; call after synchronising the device."""
        for name, start, end in self.pending:
            self.totals[name] += start.elapsed_time(end) / 1000
        self.pending.clear()

    def means(self) -> dict[str, float]:
        """Mean seconds per timed step for each phase that was timed."""
        return {p: self.totals[p] / self.steps for p in PHASES if p in self.totals and self.steps}
