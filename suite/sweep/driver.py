"""Runs a planned sweep: point by point here, or as jobs submitted to a batch scheduler.

The sweep goes on past broken points: each ends as a run with its status (finished, oom,
timeout, failed, invalid), one error line and its logs. A point that already has a finished run
with the same config hash is skipped unless forced; one whose last run did not finish is retried
only when asked (unless that run was cut short by stopping the sweep itself); one whose job is
still queued or running is left to it.
"""

from __future__ import annotations

import os
import time

from launchers import LaunchResult, launch
from suite.errors import ConfigError
from suite.launch_timing import mark
from suite.layout import threads_per_worker
from suite.paths import REPO_ROOT, git_sha
from suite.point_dir import error_line
from suite.records.record import NotStarted, record_ended
from suite.records.run_schema import INCOMPLETE, INCONSISTENT, run_params, run_status, source_tags
from suite.records.store import Store
from suite.shared_names import Status
from suite.strategies import missing_library
from suite.sweep import jobs
from suite.sweep.plan import InvalidPoint, Outcome, Point, Predict, new_point_dir, no_prediction, prediction_for
from suite.sweep.progress import Progress


def worker_env(point: Point, position: str) -> dict[str, str]:
    env = dict(os.environ)
    env["SUITE_POINT_LABEL"] = f"[{position} {point.label}]"
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(threads_per_worker(point.cfg.cluster.threads_per_worker, point.processes))
    return env


def run_point(point: Point, store: Store, position: str, prediction: dict[str, float],
              parent_run_id: str | None = None) -> Outcome:
    point_dir = new_point_dir(point, parent_run_id, prediction)
    mark("point_dir")
    start = time.time()
    try:
        ended = launch(point.cfg.cluster.scheduler, point_dir.path, point.processes, point.cfg.timeout_s,
                       worker_env(point, position), point.rank_launcher)
        mark("ranks_ended")
    except Exception as exc:  # the launcher itself broke: still one recorded run, and the sweep goes on
        ended = NotStarted(f"launcher: {error_line(exc)}")
    stopped_by = ended.stopped_by if isinstance(ended, LaunchResult) else None
    try:
        # A point cut short by stopping the sweep is run again when the sweep is resumed.
        done = record_ended(point_dir, store, ended, start, time.time(),
                            {"suite.interrupted": stopped_by} if stopped_by else {})
    except Exception as exc:  # a full disk, a store gone: the next sweep runs the point again, this one goes on
        error = f"not recorded ({error_line(exc)}); its results stay in {point_dir.path}, the next sweep runs it again"
        if stopped_by:
            raise KeyboardInterrupt(f"stopped during {point.label}; {error}") from exc
        return Outcome(point, INCOMPLETE, error, None, point_dir)
    mark("recorded")
    if stopped_by:
        raise KeyboardInterrupt(f"stopped during {point.label}; recorded as run {done.run_id}")
    return Outcome(point, done.status, done.error, done.run_id, point_dir)


def skip_reason(previous, code_now: str, force: bool, retry_failed: bool) -> str | None:
    """Why a point with this previous run needs no run now, or None."""
    if previous is None or force:
        return None
    tags, status = previous.data.tags, run_status(previous)
    if status == Status.finished:
        reason = f"finished run {previous.info.run_id} has this config"
        measured = tags.get("suite.git_sha", "?")
        if measured != code_now:
            reason += (f"\n  (measured with code {measured[:10]}, now {code_now[:10]}: "
                       "add --force / FORCE=1 to measure again)")
        return reason
    if retry_failed or "suite.interrupted" in tags or status in (INCOMPLETE, INCONSISTENT):
        return None
    return (f"its last run {previous.info.run_id} ended {status}: {tags.get('suite.error', '')} "
            "(--retry-failed / RETRY_FAILED=1 runs it again)")


def check_installed(points: list[Point]) -> None:
    """Before a sweep runs or submits anything (its jobs use this environment too): a library that a point's
    strategy needs and this environment lacks (Horovod: `make horovod`) is one line, not a launched point that fails."""
    for point in points:
        missing = missing_library(point.strategy)
        if missing:
            raise ConfigError(missing)


def run_sweep(points: list[Point], store: Store, force: bool = False, retry_failed: bool = False,
              dry_run: bool = False, parent_run_id: str | None = None,
              predict: Predict = no_prediction) -> list[Outcome]:
    """Run the points here one by one, or submit them to their cluster's scheduler. Skipped points are in
    the outcomes too, with the run that speaks for them. Runs made now are children of `parent_run_id`, each
    recorded with `predict`'s metrics for its point."""
    mark("planned")
    check_installed(points)
    for experiment in jobs.batch_experiments(points):
        jobs.collect(experiment)  # jobs that ended without recording their points
    pending = jobs.pending(points)
    code_now = git_sha(REPO_ROOT)
    outcomes, to_submit = [], []
    unpredicted: set[str] = set()  # why points went without a prediction, said once
    looked_up = []
    for point in points:
        previous = store.speaking_run(point.cfg.tracking.experiment, point.config_hash)
        waiting = pending.get((point.cfg.tracking.experiment, point.config_hash))
        looked_up.append((previous, waiting,
                          waiting.describe() if waiting else skip_reason(previous, code_now, force, retry_failed)))
    here = [k for k, (point, (_, _, reason)) in enumerate(zip(points, looked_up))
            if not reason and not jobs.is_batch(point) and not dry_run]
    predictions = {k: prediction_for(predict, points[k], f"{k + 1}/{len(points)}", unpredicted) for k in here}
    progress = Progress([predictions[k].get("predicted_epoch_time_s", 0.0) * points[k].cfg.epochs or None
                         for k in here])
    for k, (point, (previous, waiting, reason)) in enumerate(zip(points, looked_up), 1):
        mark("point")
        position = f"{k}/{len(points)}"
        if reason:
            print(f"[{position} {point.label}] skipped: {reason}", flush=True)
            if waiting:
                outcomes.append(Outcome(point, "submitted", None, None))
            else:
                outcomes.append(Outcome(point, previous.data.tags.get("suite.status", "?"), None, previous.info.run_id))
        elif jobs.is_batch(point):
            to_submit.append((position, point))
        elif dry_run:
            print(f"[{position} {point.label}] would run here ({' '.join(point.overrides)})", flush=True)
        else:
            print(f"[{position} {point.label}] starting ({' '.join(point.overrides)})", flush=True)
            outcome = run_point(point, store, position, predictions[k - 1], parent_run_id)
            line = f"[{position} {point.label}] {outcome.status}"
            print(line + (f": {outcome.error}" if outcome.error else "")
                  + (f" (run {outcome.run_id})" if outcome.run_id else "") + f"; {progress.point_done()}", flush=True)
            outcomes.append(outcome)
    return outcomes + jobs.submit(to_submit, store, dry_run, parent_run_id, predict, unpredicted)


def record_invalid(invalid: list[InvalidPoint], store: Store, dry_run: bool = False,
                   parent_run_id: str | None = None) -> list[Outcome]:
    """Record each point that cannot run here once, as a run with status `invalid` and its reason (a study's
    status matrix shows it beside the points that ran); nothing is launched."""
    outcomes = []
    code_now = git_sha(REPO_ROOT)
    for point in invalid:
        where = f"[invalid {point.label}]"
        previous = store.latest_run(point.cfg.tracking.experiment, point.config_hash)
        if previous is not None:
            print(f"{where} recorded already (run {previous.info.run_id}): {point.error}", flush=True)
            outcomes.append(Outcome(point, Status.invalid, point.error, previous.info.run_id))
            continue
        if dry_run:
            print(f"{where} cannot run here, would be recorded as invalid: {point.error}", flush=True)
            continue
        params = run_params(point.cfg, {}, {})  # no layout: the strategy could not lay the point out
        tags = {"suite.status": Status.invalid, "suite.error": point.error, "suite.config_hash": point.config_hash,
                "suite.git_sha": code_now, "suite.label": point.label, **source_tags(code_now)}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        now = time.time()
        run_id = store.record(point.cfg.tracking.experiment, point.label, params, tags, [], {}, [], now, now)
        print(f"{where} recorded as invalid (run {run_id}): {point.error}", flush=True)
        outcomes.append(Outcome(point, Status.invalid, point.error, run_id))
    return outcomes
