"""How a point's ranks are started, one module per scheduler.

`local` runs a point here and waits for it (one process per rank); the batch schedulers (`slurm`, `lsf`, `pbs`)
get a job script and return a job id at once (see `launchers.batch`).
"""

from __future__ import annotations

from pathlib import Path

from launchers.batch import Scheduler
from launchers.local import LaunchResult, launch_local
from launchers.lsf import Lsf
from launchers.pbs import Pbs
from launchers.slurm import Slurm

BATCH_SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (Slurm(), Lsf(), Pbs())}
SCHEDULERS = ("local", *BATCH_SCHEDULERS)


def launch(scheduler: str, point_dir: Path, workers: int, timeout_s: float, env: dict[str, str],
           rank_launcher: str | None = None) -> LaunchResult:
    """Run one point to completion (or its timeout) and return how its launcher ended."""
    if scheduler == "local":
        return launch_local(point_dir, workers, timeout_s, env, rank_launcher)
    raise ValueError(f"no launcher for scheduler {scheduler!r}")
