"""Points as batch jobs: submitted by `make sweep`, watched by `make status`, recorded by `make collect`.

A submitted point's directory holds `job.json` (scheduler, job id, script). Until it also holds
`recorded.json`, its job is pending: queued, running, or ended without recording the point (killed
outright, or unable to reach the store). `collect` records those with the scheduler's verdict.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass

from omegaconf import OmegaConf

from launchers import BATCH_SCHEDULERS, jobscript
from launchers.batch import ENDED, Job, JobState, SchedulerError, Step, cores_per_rank
from suite.errors import ConfigError
from suite.paths import REPO_ROOT, results_dir
from suite.predict.predictor import recorded_prediction
from suite.records.point_dir import PointDir, error_line
from suite.records.record import finish
from suite.records.store import Store, store_uri
from suite.records.verdict import JobEnded, NotStarted
from suite.sweep.plan import Point
from suite.sweep.point import Outcome, new_point_dir, point_dir_path
from suite.vocabulary import Status


def is_batch(point: Point) -> bool:
    return point.cfg.cluster.scheduler in BATCH_SCHEDULERS


def submitted_dirs(experiment: str | None = None) -> list[PointDir]:
    """Point directories of submitted jobs, oldest first."""
    pattern = f"{experiment or '*'}/*/job.json"
    return [PointDir(p.parent) for p in sorted((results_dir() / "points").glob(pattern))]


def job_states(dirs: list[PointDir]) -> dict[tuple[str, str], JobState]:
    """(scheduler, job id) -> state, one query per scheduler; jobs the scheduler has forgotten are left out."""
    wanted: dict[str, set[str]] = {}
    for out in dirs:
        job = out.job()
        wanted.setdefault(job["scheduler"], set()).add(job["job_id"])
    return {(name, job_id): state for name, ids in wanted.items()
            for job_id, state in BATCH_SCHEDULERS[name].states(sorted(ids)).items()}


@dataclass(frozen=True)
class PendingPoint:
    out: PointDir
    state: JobState | None  # None: the scheduler no longer knows the job

    @property
    def job(self) -> dict:
        return self.out.job()

    def describe(self) -> str:
        job = self.job
        phase = self.state.phase if self.state else "forgotten by the scheduler"
        return f"{job['scheduler']} job {job['job_id']} is {phase}"


class Stores:
    """One Store per tracking URI, for points that report to different ones."""

    def __init__(self) -> None:
        self._stores: dict[str, Store] = {}

    def __call__(self, uri: str) -> Store:
        if uri not in self._stores:
            self._stores[uri] = Store(uri)
        return self._stores[uri]


def unrecorded(experiment: str | None = None) -> list[PendingPoint]:
    """Submitted points not recorded yet, with their jobs' states (one query per scheduler; writes nothing)."""
    waiting = [out for out in submitted_dirs(experiment) if not out.recorded()]
    states = job_states(waiting)
    return [PendingPoint(out, states.get((out.job()["scheduler"], out.job()["job_id"]))) for out in waiting]


def collect(experiment: str | None = None) -> list[PendingPoint]:
    """Record every point whose job ended without recording it; return the points still queued or running."""
    stores = Stores()
    still = []
    for waiting in unrecorded(experiment):
        out, state, job = waiting.out, waiting.state, waiting.job
        if state and state.phase != ENDED:
            still.append(waiting)
            continue
        end = out.launcher_log.stat().st_mtime if out.launcher_log.exists() else time.time()
        done = finish(out, stores(store_uri(OmegaConf.load(out.config))), JobEnded(state), job["submitted"], end)
        print(f"collected {out.point()['label']} ({job['scheduler']} job {job['job_id']}): {done.status}"
              + (f": {done.error}" if done.error else "") + f" (run {done.run_id})", flush=True)
    return still


def batch_experiments(points: list[Point]) -> list[str]:
    return sorted({p.cfg.tracking.experiment for p in points if is_batch(p)})


def pending(points: list[Point]) -> dict[tuple[str, str], PendingPoint]:
    """(experiment, config hash) -> its job, for the submitted points of these points' experiments that are not
    recorded yet: queued, running, or ended unrecorded (`collect` records those). Writes nothing."""
    found = {}
    for experiment in batch_experiments(points):
        for waiting in unrecorded(experiment):
            point = waiting.out.point()
            found[(point["experiment"], point["config_hash"])] = waiting
    return found


def check_submittable(points: list[Point], dry_run: bool) -> None:
    """Before anything runs: the scheduler's submit command must be here (a cluster's login node)."""
    if dry_run:
        return
    for name in sorted({p.cfg.cluster.scheduler for p in points if is_batch(p)}):
        command = BATCH_SCHEDULERS[name].submit_command
        if not shutil.which(command):
            raise ConfigError(f"{command} not found: submit from a login node of the {name} cluster "
                              "(DRY_RUN=1 / --dry-run writes the job scripts without submitting)")


def rank_threads(cfg) -> int:
    """OMP_NUM_THREADS of a batch job's ranks."""
    return cfg.cluster.threads_per_worker or cores_per_rank(cfg.cluster)


def batch_job(name: str, cfg, steps: tuple[Step, ...]) -> Job:
    """A job of `steps` on `cfg`'s cluster, reporting to `cfg`'s store; its script and log in
    results/jobs/<experiment>/."""
    jobs_dir = results_dir() / "jobs" / cfg.tracking.experiment
    env = {"PYTHONUNBUFFERED": "1", "SUITE_RESULTS_DIR": str(results_dir()), "MLFLOW_TRACKING_URI": store_uri(cfg),
           # a job that cannot reach a tracking server gives up soon: `make collect` records its points later
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
    return Job(name, cfg.cluster, steps, jobs_dir / f"{name}.sh", jobs_dir / f"{name}.out", sys.executable,
               REPO_ROOT, env)


def _job(name: str, points: list[tuple[Point, PointDir]]) -> Job:
    cfg = points[0][0].cfg
    steps = tuple(Step(out.path, point.label, point.processes, point.cfg.nodes, rank_threads(cfg), point.rank_launcher)
                  for point, out in points)
    return batch_job(name, cfg, steps)


def submit(items: list[tuple[str, Point]], store: Store, dry_run: bool,
           parent_run_id: str | None = None) -> list[Outcome]:
    """Submit the points (position, point) as jobs of `cluster.job.points_per_job` points of one cluster each
    and return at once; with `dry_run`, only write the job scripts. A job the scheduler refuses is recorded
    as failed."""
    if not dry_run:  # created once here, not by many jobs at the same moment
        for experiment in {point.cfg.tracking.experiment for _, point in items}:
            store.experiment_id(experiment)
    by_cluster: dict[str, list[tuple[str, Point]]] = {}
    for position, point in items:
        by_cluster.setdefault(point.cfg.cluster.name, []).append((position, point))
    outcomes = []
    for group in by_cluster.values():
        per_job = group[0][1].cfg.cluster.job.points_per_job
        for first in range(0, len(group), per_job):
            outcomes += _submit_job(group[first:first + per_job], store, dry_run, parent_run_id)
    return outcomes


def _submit_job(chunk: list[tuple[str, Point]], store: Store, dry_run: bool,
                parent_run_id: str | None) -> list[Outcome]:
    scheduler = BATCH_SCHEDULERS[chunk[0][1].cfg.cluster.scheduler]
    dirs = [PointDir(point_dir_path(p)) if dry_run else new_point_dir(p, parent_run_id, recorded_prediction(p))
            for _, p in chunk]
    name = dirs[0].path.name + (f"+{len(chunk) - 1}" if len(chunk) > 1 else "")
    job = _job(name, [(p, out) for (_, p), out in zip(chunk, dirs)])
    script = jobscript.write(job, scheduler)
    where = " ".join(f"[{position} {p.label}]" for position, p in chunk)
    if dry_run:
        print(f"{where} job script: {script}", flush=True)
        return []
    try:
        job_id = scheduler.submit(script)
    except SchedulerError as e:
        print(f"{where} not submitted: {e}", flush=True)
        refused = NotStarted(f"submission: {error_line(e)}")
        return [Outcome(point, Status.failed, str(e), finish(out, store, refused, time.time(), time.time()).run_id, out)
                for (_, point), out in zip(chunk, dirs)]
    for out in dirs:
        out.write_job({"scheduler": scheduler.name, "job_id": job_id, "script": str(script), "submitted": time.time()})
    print(f"{where} submitted: {scheduler.name} job {job_id} ({script})", flush=True)
    return [Outcome(point, "submitted", None, None, out) for (_, point), out in zip(chunk, dirs)]
