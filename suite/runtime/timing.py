"""Wall-clock timers for the phases of a training step.

On CPU a phase is timed with the host clock. On GPU it is timed with CUDA events on the current
stream of each GPU the rank drives (a phase lasts as long as on the GPU where it lasts longest), read
once per epoch after the epoch's final synchronisation, so timing a phase never stalls the host from
queueing work ahead (the epoch clock stays that of an uninstrumented loop).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch

PHASES = ("data", "forward", "backward", "optimizer")


def synchronize(*devices: torch.device) -> None:
    """Wait for the work queued on `devices` so that a clock read covers it (a no-op on CPU)."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class PhaseTimer:
    """Accumulates seconds per phase over the steps taken while `enabled` (warm-up steps are not)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.devices = [device]  # where a phase's events are recorded: a runtime driving several GPUs names them
        self.enabled = False
        self.totals: dict[str, float] = defaultdict(float)
        self.pending: list[tuple[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]]] = []
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
                streams = [torch.cuda.current_stream(device) for device in self.devices]
                events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in streams]
                for (start, _), stream in zip(events, streams):
                    start.record(stream)
                yield
                for (_, end), stream in zip(events, streams):
                    end.record(stream)
                self.pending += [(name, events) for name in names]
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
        """Fold the recorded CUDA events into the totals; call after synchronising the devices."""
        for name, events in self.pending:
            self.totals[name] += max(start.elapsed_time(end) for start, end in events) / 1000
        self.pending.clear()

    def means(self) -> dict[str, float]:
        """Mean seconds per timed step for each phase that was timed."""
        return {p: self.totals[p] / self.steps for p in PHASES if p in self.totals and self.steps}
