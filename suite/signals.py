"""SIGTERM as an exception: how a scheduler's time limit, a preemption or a cancel reaches Python code.

Slurm, LSF and PBS send SIGTERM some seconds before they kill a job. Raising an exception (not an
`Exception`, so that no library's error handling swallows it) unwinds the training loop: the epochs
already completed are on disk, the rank writes its error report, and the point ends as `timeout`.
"""

from __future__ import annotations

import signal


class Stopped(BaseException):
    """SIGTERM arrived: the job hit its time limit, was preempted or cancelled, or the sweep was stopped."""


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped("stopped by SIGTERM (a time limit, a preemption or a cancel)")


def raise_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _raise_stopped)
