"""A sweep's progress as it runs points here: points done of those to run, time elapsed, and the time left, with what
it rests on. A point the performance model priced (its recorded prediction: epoch time x epochs) is expected to take
its price times how much longer the points run so far took than theirs (launch, evaluation and the model's error
included), and no less than the quickest point run so far (a point's launch and evaluation do not shrink with its
price: a grid's small GPT-2 after its ResNets was expected to take seconds); a point without a price, the mean wall
time of the points run so far.
"""

from __future__ import annotations

import time


def duration(seconds: float) -> str:
    """1h02m, 3m05s, 12s."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    def __init__(self, priced_s: list[float | None], clock=time.monotonic) -> None:
        """`priced_s`: per point to run, in order, the model's seconds for it (None: not priced)."""
        self.priced_s, self.walls, self.clock = priced_s, [], clock
        self.started = self.last = clock()

    def point_done(self) -> str:
        """Count one point run; the line that says where the sweep stands."""
        now = self.clock()
        self.walls.append(now - self.last)
        self.last = now
        done, left = len(self.walls), self.priced_s[len(self.walls):]
        line = f"{done}/{len(self.priced_s)} run here, {duration(now - self.started)} elapsed"
        if not left:
            return line
        seconds, basis = self.left_s(left)
        return line + f", about {duration(seconds)} left ({basis})"

    def left_s(self, left: list[float | None]) -> tuple[float, str]:
        """The seconds the points `left` are expected to take, and what that rests on, in words."""
        mean, floor = sum(self.walls) / len(self.walls), min(self.walls)
        priced = [(wall, price) for wall, price in zip(self.walls, self.priced_s) if price]
        scale = sum(w for w, _ in priced) / sum(p for _, p in priced) if priced else None
        if scale is None or not any(left):
            return mean * len(left), f"{duration(mean)} a point, as the points run so far"
        seconds = sum(max(price * scale, floor) if price else mean for price in left)
        return seconds, (f"the model's prices x {scale:.2g} as the points run so far took, each at least "
                         f"{duration(floor)}")
