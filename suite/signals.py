"""SIGTERM as an exception: how a scheduler's time limit, a preemption or a cancel reaches Python code.

Before a job's time limit the job script stops its ranks with SIGTERM, or with SIGUSR2 where their launcher
turns SIGTERM into SIGKILL (srun); LSF also sends SIGUSR2 at the run limit itself. Raising an exception (not an
`Exception`, so that no library's error handling swallows it) unwinds the training loop: the epochs
already completed are on disk, the rank writes its error report, and the point ends as `timeout`.
"""

from __future__ import annotations

import signal


class Stopped(BaseException):
    """SIGTERM arrived: the job hit its time limit, was preempted or cancelled, or the sweep was stopped."""


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped(f"stopped by {signal.Signals(signum).name} (a time limit, a preemption or a cancel)")


def raise_on_sigterm() -> None:
    for stop in (signal.SIGTERM, signal.SIGUSR2):
        signal.signal(stop, _raise_stopped)
