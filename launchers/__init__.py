"""How a point's ranks are started, one module per scheduler."""

from __future__ import annotations

from pathlib import Path

from launchers.local import LaunchResult, launch_local


SCHEDULERS = ("local",)


def launch(scheduler: str, point_dir: Path, workers: int, timeout_s: float, env: dict[str, str]) -> LaunchResult:
    """Run one point to completion (or its timeout) and return how its launcher ended."""
    if scheduler == "local":
        return launch_local(point_dir, workers, timeout_s, env)
    raise ValueError(f"no launcher for scheduler {scheduler!r}")
