"""A point directory becomes one MLflow run, exactly once, whoever gets there first. So does a calibration
job's directory (`make calibrate`), which also leaves its record (see suite.records.calibration).

The local driver records a point as soon as its ranks end. A batch job's last step for each point
(`python -m suite.records.record <point dir> --exit-code N --started T`) judges it and records it itself
into a tracking server (`cluster.job.record_in_job`); otherwise, or if that fails, it leaves what it saw in
`ended.json` for `make collect` on the login node, so that one process writes a sqlite store. `make
collect` records those points and the ones of jobs that ended without that step. Each recorder
claims the directory first, checks that the store has no complete run for it yet, and leaves
`recorded.json` behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from suite.config import is_calibration
from suite.point_dir import PointDir, error_line
from suite.records.calibration import write_calibration
from suite.records.run_schema import complete, source_tags
from suite.records.store import Store, is_server
from suite.records.verdict import Ending, ended_status
from suite.runtime.rendezvous import scheduler_job_id
from suite.shared_names import Status

TIMEOUT_EXIT = 3  # tells the job script that the ranks were stopped by SIGTERM: start no further point


def write_point(point_dir: PointDir, store: Store, tags: dict[str, str], start: float, end: float) -> str:
    """A point's run: its params, epochs, summary and artifacts."""
    point = point_dir.point()
    summary = {**(point_dir.summary() or {}), **point.get("predictions", {})}  # predicted even if it did not run
    return store.record(point["experiment"], point.get("run_name", point["label"]), point["params"], tags,
                        point_dir.epochs(), summary, point_dir.artifacts(), start, end)


def record_point(point_dir: PointDir, store: Store, status: str, error: str | None, start: float, end: float,
                 extra_tags: dict[str, str] | None = None) -> str | None:
    """Record the point (or calibration job) unless that is done already; its run id, or None while another
    recorder holds it."""
    done = point_dir.recorded()
    if done:
        return done["run_id"]
    if not point_dir.claim():
        return None
    try:
        point = point_dir.point()
        runs = store.runs_for_point_dir(point["experiment"], str(point_dir.path))
        existing = next((run for run in runs if complete(run)), None)
        if existing:  # recorded by someone who was stopped before leaving recorded.json
            point_dir.mark_recorded(existing.info.run_id, store.uri, existing.data.tags.get("suite.status", status))
            return existing.info.run_id
        for run in runs:  # left part-way by a recorder that stopped (a full disk): kept, ended, and written anew
            if run.info.status == "RUNNING":
                store.client.set_terminated(run.info.run_id, "KILLED")
        job = point_dir.job() or {}
        tags = {"suite.status": status, "suite.config_hash": point["config_hash"], "suite.git_sha": point["git_sha"],
                "suite.point_dir": str(point_dir.path), "suite.label": point["label"], **source_tags(point["git_sha"]),
                **(extra_tags or {})}
        job_id = job.get("job_id") or scheduler_job_id(os.environ)
        if job_id:
            tags["suite.job_id"] = job_id
        if job:
            tags["suite.scheduler"] = job["scheduler"]
        if error:
            tags["suite.error"] = error
        if point.get("parent_run_id"):
            tags["mlflow.parentRunId"] = point["parent_run_id"]
        write = write_calibration if is_calibration(OmegaConf.load(point_dir.config)) else write_point
        run_id = write(point_dir, store, tags, start, end)
        point_dir.mark_recorded(run_id, store.uri, status)
        return run_id
    finally:
        point_dir.release()


@dataclass(frozen=True)
class Recorded:
    status: Status
    error: str | None
    run_id: str | None  # None while another recorder holds the point


def record_ended(point_dir: PointDir, store: Store, ended: Ending, start: float, end: float,
           tags: dict[str, str] | None = None) -> Recorded:
    """Judge how a point ended and record it: the path of the local driver and `make collect` (a batch job's last
    step judges the same way, `main`, and records only where its points do)."""
    status, error = ended_status(point_dir, ended)
    return Recorded(status, error, record_point(point_dir, store, status, error, start, end, tags))


def records_in_job(cfg: DictConfig, uri: str) -> bool:
    """Whether a batch job's last step records its point into the store `uri` itself (cluster.job.record_in_job;
    by default only into a tracking server)."""
    chosen = cfg.cluster.job.get("record_in_job")
    return is_server(uri) if chosen is None else chosen


def main(argv: list[str]) -> int:
    """The last step of a batch job for one point: judge how its ranks ended, and record the point if the job
    records its points itself, else leave it for `make collect` (ended.json). Exit code 3 on a timeout."""
    parser = argparse.ArgumentParser(prog="python -m suite.records.record", description=main.__doc__)
    parser.add_argument("point_dir")
    parser.add_argument("--exit-code", type=int, required=True, help="exit code of the command that ran the ranks")
    parser.add_argument("--started", type=float, required=True, help="when the ranks started (seconds since 1970)")
    args = parser.parse_args(argv)
    from launchers import LaunchResult
    from suite.records.store import store_uri

    point_dir = PointDir(args.point_dir)
    label = point_dir.point()["label"]
    cfg = OmegaConf.load(point_dir.config)
    now = time.time()
    status, error = ended_status(point_dir, LaunchResult(args.exit_code, False, now - args.started))
    said = f"suite: {label} {status}" + (f": {error}" if error else "")
    stop = TIMEOUT_EXIT if status == Status.timeout else 0
    uri = store_uri(cfg)
    try:
        if not records_in_job(cfg, uri):
            point_dir.write_ended(args.exit_code, args.started, now)
            print(f"{said} (`make collect` on the login node records it into {uri})", flush=True)
            return stop
        try:
            run_id = record_point(point_dir, Store(uri), status, error, args.started, now)
        except Exception:
            point_dir.write_ended(args.exit_code, args.started, now)  # what `make collect` will judge it by
            raise
    except Exception as e:  # e.g. the tracking server is unreachable: the results stay for `make collect`
        print(f"{said}; not recorded ({error_line(e)}); its results stay in {point_dir.path} "
              "and `make collect` records them", flush=True)
        return stop or 1
    print(f"{said} ({f'run {run_id}' if run_id else 'another process is recording it'})", flush=True)
    return stop


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
