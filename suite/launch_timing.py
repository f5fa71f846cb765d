"""Marks of a point's way from the driver's start to its recorded run, for `make bench-launch`.

With $SUITE_TIMING naming a file, the driver and every rank append one JSON line per mark (what just
ended, when, which rank); unset, a mark costs one look-up in the environment.
"""

from __future__ import annotations

import json
import os
import time

ENV = "SUITE_TIMING"


def mark(event: str, rank: int | None = None) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a") as f:  # one short append per line: the processes' lines do not interleave
            f.write(json.dumps({"event": event, "time": time.time(), "rank": rank}) + "\n")
