"""Runs a planned sweep point by point and records every point as one MLflow run.

The sweep goes on past broken points: each ends as a run with its status (finished, oom,
timeout, failed, invalid), one error line and its logs. Points that already have a finished run
with the same config hash are skipped unless forced.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from omegaconf import OmegaConf

from launchers import LaunchResult, launch
from suite.dist import threads_per_worker
from suite.manifest import git_sha
from suite.paths import REPO_ROOT, results_dir
from suite.plan import Point
from suite.point_dir import PointDir, error_line
from suite.tracking import Store, run_params


@dataclass(frozen=True)
class Outcome:
    point: Point
    status: str
    error: str | None
    run_id: str | None
    point_dir: PointDir | None = None  # None when skipped


def new_point_dir(point: Point) -> PointDir:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = results_dir() / "points" / point.cfg.tracking.experiment
    name = f"{stamp}-{point.label.replace('/', '_')}-{point.config_hash[:8]}"
    for attempt in range(1000):  # never reuse a directory: earlier results stay untouched
        path = base / (name if attempt == 0 else f"{name}.{attempt}")
        try:
            path.mkdir(parents=True)
            return PointDir(path)
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a point directory under {base}")


def worker_env(point: Point, position: str) -> dict[str, str]:
    env = dict(os.environ)
    env["SUITE_POINT_LABEL"] = f"[{position} {point.label}]"
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(threads_per_worker(point.cfg.cluster.threads_per_worker, point.processes))
    return env


def _failed_ranks(launcher_text: str) -> dict[int, int]:
    """Exit code of each failed rank in torchrun's failure summary (negative: killed by that signal)."""
    entries = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", launcher_text)
    return {int(rank): int(code) for rank, code in entries}


def _first_exception_line(launcher_text: str) -> str | None:
    """The first `SomeError: message` a worker printed before any error report could be written."""
    for line in launcher_text.splitlines():
        line = line.split("]: ", 1)[-1].strip()  # torchrun prefixes worker output with [rank<i>]:
        if re.match(r"^[\w.]+(Error|Exception)\b", line) and "ChildFailedError" not in line:
            return line
    return None


def judge(out: PointDir, result: LaunchResult, timeout_s: float) -> tuple[str, str | None]:
    """Status and error line of a point from what its workers left behind and how the launcher ended."""
    if result.timed_out:
        return "timeout", f"no result after timeout_s={timeout_s:g} s; the point was stopped"
    if result.interrupted:
        return "failed", f"interrupted after {result.seconds:.0f} s: the sweep was stopped"
    if result.returncode == 0 and out.summary() is not None:
        return "finished", None
    launcher_log = out.path / "launcher.log"
    text = launcher_log.read_text(errors="replace") if launcher_log.exists() else ""
    errors = out.errors()  # earliest first: the first is the root cause, the others its consequences
    failed = _failed_ranks(text)
    reported = {e["rank"] for e in errors}
    # A rank killed by a signal cannot report; the errors of the others are then consequences of its death.
    # SIGTERM is how torchrun stops the surviving ranks, so it is never the cause.
    killed = [rank for rank, code in failed.items() if code < 0 and code != -15 and rank not in reported]
    killed.sort(key=lambda rank: (failed[rank] != -9, rank))
    if errors and not killed:
        return errors[0]["status"], f"rank {errors[0]['rank']}: {errors[0]['error']}"
    rank = killed[0] if killed else next(iter(failed), None)
    code = failed.get(rank, result.returncode)
    who = "a worker" if rank is None else f"rank {rank}"
    if code == -9:
        return "oom", f"{who} was killed by SIGKILL (most likely the kernel's out-of-memory killer)"
    died = f"killed by signal {-code}" if code and code < 0 else f"exited with code {code}"
    exception = _first_exception_line(text)
    detail = f": {exception}" if exception else " without an error report (see its log)"
    return "failed", f"{who} {died}{detail}"


def run_point(point: Point, store: Store, position: str) -> Outcome:
    out = new_point_dir(point)
    OmegaConf.save(point.cfg, out.config, resolve=True)
    start = time.time()
    try:
        result = launch(point.cfg.cluster.scheduler, out.path, point.processes, point.cfg.timeout_s,
                        worker_env(point, position))
        status, error = judge(out, result, point.cfg.timeout_s)
    except Exception as exc:  # the launcher itself broke: still one recorded run, and the sweep goes on
        result = LaunchResult(None, False, time.time() - start)
        status, error = "failed", f"launcher: {error_line(exc)}"
    tags = {"suite.status": status, "suite.config_hash": point.config_hash, "suite.git_sha": git_sha(REPO_ROOT),
            "suite.point_dir": str(out.path), "suite.label": point.label}
    if error:
        tags["suite.error"] = error
    run_id = store.record(
        point.cfg.tracking.experiment, point.label,
        run_params(point.cfg, point.global_batch_size, point.derived_params), tags,
        out.epochs(), out.summary() or {},
        [out.config, out.manifest_file, out.logs, out.path / "launcher.log", out.summary_file, out.epochs_file,
         *sorted(out.path.glob("error.rank*.json"))],
        start, time.time(),
    )
    if result.interrupted:
        raise KeyboardInterrupt(f"stopped during {point.label}; recorded as run {run_id}")
    return Outcome(point, status, error, run_id, out)


def run_sweep(points: list[Point], store: Store, force: bool = False) -> list[Outcome]:
    outcomes = []
    current_sha = git_sha(REPO_ROOT)
    for k, point in enumerate(points, 1):
        position = f"{k}/{len(points)}"
        done = None if force else store.finished_run(point.cfg.tracking.experiment, point.config_hash)
        if done:
            print(f"[{position} {point.label}] skipped: finished run {done.info.run_id} has this config", flush=True)
            if done.data.tags.get("suite.git_sha") != current_sha:
                print(f"  (measured with code {done.data.tags.get('suite.git_sha', '?')[:10]}, now {current_sha[:10]}: "
                      "add --force / FORCE=1 to measure again)", flush=True)
            outcomes.append(Outcome(point, "finished", None, done.info.run_id))
            continue
        print(f"[{position} {point.label}] starting ({' '.join(point.overrides)})", flush=True)
        outcome = run_point(point, store, position)
        line = f"[{position} {point.label}] {outcome.status}"
        print(line + (f": {outcome.error}" if outcome.error else "") + f" (run {outcome.run_id})", flush=True)
        outcomes.append(outcome)
    return outcomes
