"""A torch.profiler trace of the first `profile.steps` timed steps of one rank, for Perfetto or chrome://tracing.

The profiler is set up before the first epoch's clock starts, so the epoch starts with the profiler already
prepared (its warm-up: the wait at the epoch's starting barrier, which is not recorded). It then records steps
1..N of the first epoch as `ProfilerStep#1` ... `ProfilerStep#N` and stops as step N+1 begins, or with the epoch.
While it records, each timed phase (`PhaseTimer.phase`: data, forward, backward, optimizer, a pipeline's schedule)
is a named range, on CUDA also an NVTX range, so that Nsight Systems shows the same phases. The trace is written
after the epoch's clock stops, as gzip-compressed JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule

from suite.runtime.timing import PhaseTimer


@contextmanager
def cuda_range(name: str) -> Iterator[None]:
    with record_function(name), torch.cuda.nvtx.range(name):
        yield


def phase_ranges(device: torch.device) -> Callable[[str], AbstractContextManager]:
    return cuda_range if device.type == "cuda" else record_function


class StepTrace:
    """Traces `steps` training steps into `path`: `prepare` before the epoch's clock, `step` as each step begins,
    `finish` once the epoch's clock stopped."""

    def __init__(self, steps: int, timer: PhaseTimer, path: Path) -> None:
        self.timer, self.path = timer, path
        activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (timer.device.type == "cuda")
        self.profiler = profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1))
        self.recording = False

    def prepare(self) -> None:
        self.profiler.start()

    def step(self) -> None:
        """A step begins (and the one before it ends)."""
        if self.profiler.current_action == ProfilerAction.NONE:
            return
        self.profiler.step()
        self.recording = self.profiler.current_action != ProfilerAction.NONE
        self.timer.ranges = phase_ranges(self.timer.device) if self.recording else None
        if not self.recording:
            self.profiler.stop()

    def finish(self) -> None:
        """Stop recording if the epoch ended first, and write the trace."""
        if self.recording:
            self.profiler.stop()
            self.recording = False
            self.timer.ranges = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self.path))
