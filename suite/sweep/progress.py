"""A sweep's progress as it runs points here: points done of those to run, time elapsed, and the time left,
estimated from the points measured so far (their mean wall time, each point's launch included, times the points
left to run)."""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """1h02m, 3m05s, 12s."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    def __init__(self, to_run: int, clock=time.monotonic) -> None:
        self.to_run, self.done, self.clock = to_run, 0, clock
        self.started = clock()

    def point_done(self) -> str:
        """Count one point run; the line that says where the sweep stands."""
        self.done += 1
        elapsed = self.clock() - self.started
        left = self.to_run - self.done
        eta = f", about {duration(elapsed / self.done * left)} left" if left else ""
        return f"{self.done}/{self.to_run} run here, {duration(elapsed)} elapsed{eta}"
