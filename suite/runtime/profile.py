"""A torch.profiler trace of the first `profile.steps` timed steps of one rank, for Perfetto or chrome://tracing.

The profiler starts before the first epoch's clock, records steps 1..N of the first epoch as `ProfilerStep#1` ...
`ProfilerStep#N` (a step from the start of its data phase to the start of the next step's), and records nothing
from step N+1 on. It is stopped, and the trace written as gzip-compressed JSON, only after the epoch's clock:
stopping torch's profiler while a collective it recorded the start of is still running (a pipeline's send, on
gloo's thread) corrupts its memory. While it records, each timed phase (`PhaseTimer.phase`: data, forward,
backward, optimizer, a pipeline's schedule) is a named range, on CUDA also an NVTX range, so that Nsight Systems
shows the same phases. On a GPU the device is synchronised once, as step N ends, so that the trace holds the
kernels of step N.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from suite.runtime.metrics import PhaseTimer, synchronize

# Collection is toggled off for every kind of activity: torch warns when CPU is toggled without both GPU kinds.
ALL_ACTIVITIES = (ProfilerActivity.CPU, ProfilerActivity.CUDA, ProfilerActivity.XPU)


@contextmanager
def cuda_range(name: str) -> Iterator[None]:
    with record_function(name), torch.cuda.nvtx.range(name):
        yield


def phase_ranges(device: torch.device) -> Callable[[str], AbstractContextManager]:
    return cuda_range if device.type == "cuda" else record_function


class StepTrace:
    """Traces the first `steps` steps of an epoch into `path`: `start` before the epoch's clock, `step` as each
    step begins, `finish` once the epoch's clock stopped."""

    def __init__(self, steps: int, timer: PhaseTimer, path: Path) -> None:
        self.steps, self.timer, self.path = steps, timer, path
        on_gpu = timer.device.type == "cuda"
        self.profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else
                                [ProfilerActivity.CPU])
        self.begun = 0  # steps begun since `start`
        self.step_range: record_function | None = None

    def start(self) -> None:
        self.profiler.start()

    def step(self) -> None:
        """A step begins, and the one before it ends."""
        if self.begun > self.steps:
            return
        self.begun += 1
        self._end_step()
        if self.begun <= self.steps:
            self.step_range = record_function(f"ProfilerStep#{self.begun}")
            self.step_range.__enter__()
            self.timer.ranges = phase_ranges(self.timer.device)
        else:
            synchronize(self.timer.device)
            self.profiler.toggle_collection_dynamic(False, ALL_ACTIVITIES)

    def finish(self) -> None:
        """Stop the profiler (the epoch's collectives have ended) and write the trace."""
        self._end_step()
        self.profiler.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(self.path))

    def _end_step(self) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None
            self.timer.ranges = None
