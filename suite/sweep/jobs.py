"""Points as batch jobs: submitted by `make sweep`, watched by `make status`, recorded by `make collect`.

A submitted point's directory holds `job.json` (scheduler, job id, script). Until it also holds
`recorded.json`, its job is pending: queued, running, or ended without recording the point. `collect`
records those: as the job's last step judged them (`ended.json`: by default a job leaves its points to
`collect` unless they report to a tracking server, suite.records.record), else, for a job ended before
that step (killed outright), with the scheduler's verdict.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import OmegaConf

from launchers import BATCH_SCHEDULERS, LaunchResult, jobscript, site_rules
from launchers.batch import ENDED, Job, JobState, SchedulerError, Step
from suite.errors import ConfigError
from suite.layout import cores_per_rank
from suite.paths import REPO_ROOT, results_dir
from suite.point_dir import PointDir, error_line
from suite.records.record import Ending, JobEnded, NotStarted, record_ended
from suite.records.store import Store, store_uri
from suite.shared_names import Status
from suite.sweep.plan import Outcome, Point, Predict, new_point_dir, no_prediction, point_dir_path, prediction_for


def is_batch(point: Point) -> bool:
    return point.cfg.cluster.scheduler in BATCH_SCHEDULERS


def submitted_dirs(experiment: str | None = None) -> list[PointDir]:
    """Point directories of submitted jobs, oldest first; without `experiment`, `make calibrate`'s jobs too."""
    found = sorted((results_dir() / "points").glob(f"{experiment or '*'}/*/job.json"))
    if experiment is None:
        found += sorted((results_dir() / "calibration" / "jobs").glob("*/*/job.json"))
    return [PointDir(p.parent) for p in found]


def job_states(dirs: list[PointDir]) -> dict[tuple[str, str], JobState]:
    """(scheduler, job id) -> state, one query per scheduler; jobs the scheduler has forgotten are left out."""
    wanted: dict[str, set[str]] = {}
    for point_dir in dirs:
        job = point_dir.job()
        wanted.setdefault(job["scheduler"], set()).add(job["job_id"])
    return {(name, job_id): state for name, ids in wanted.items()
            for job_id, state in BATCH_SCHEDULERS[name].states(sorted(ids)).items()}


@dataclass(frozen=True)
class PendingPoint:
    point_dir: PointDir
    state: JobState | None  # None: the scheduler no longer knows the job

    @property
    def job(self) -> dict:
        return self.point_dir.job()

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
    waiting = [point_dir for point_dir in submitted_dirs(experiment) if not point_dir.recorded()]
    states = job_states(waiting)
    return [PendingPoint(point_dir, states.get((point_dir.job()["scheduler"], point_dir.job()["job_id"])))
            for point_dir in waiting]


def collect(experiment: str | None = None) -> list[PendingPoint]:
    """Record every point whose ranks ended, as the job's last step judged them (without asking the scheduler), and
    every point whose job ended without that step, with the scheduler's verdict; return the points still queued or
    running."""
    stores = Stores()

    def record(point_dir: PointDir, ended: Ending, start: float, end: float) -> None:
        job = point_dir.job()
        done = record_ended(point_dir, stores(store_uri(OmegaConf.load(point_dir.config))), ended, start, end)
        print(f"collected {point_dir.point()['label']} ({job['scheduler']} job {job['job_id']}): {done.status}"
              + (f": {done.error}" if done.error else "") + f" (run {done.run_id})", flush=True)

    unjudged = []
    for point_dir in submitted_dirs(experiment):
        if point_dir.recorded():
            continue
        seen = point_dir.ended()
        if seen:  # the job saw the ranks end (its other points may still run)
            record(point_dir, LaunchResult(seen["exit_code"], False, seen["ended"] - seen["started"]), seen["started"],
                   seen["ended"])
        else:
            unjudged.append(point_dir)
    states = job_states(unjudged)
    still = []
    for point_dir in unjudged:
        job = point_dir.job()
        state = states.get((job["scheduler"], job["job_id"]))
        if state and state.phase != ENDED:
            still.append(PendingPoint(point_dir, state))
            continue
        end = point_dir.launcher_log.stat().st_mtime if point_dir.launcher_log.exists() else time.time()
        record(point_dir, JobEnded(state), job["submitted"], end)
    return still


def batch_experiments(points: list[Point]) -> list[str]:
    return sorted({p.cfg.tracking.experiment for p in points if is_batch(p)})


def pending(points: list[Point]) -> dict[tuple[str, str], PendingPoint]:
    """(experiment, config hash) -> its job, for the submitted points of these points' experiments that are not
    recorded yet: queued, running, or ended unrecorded (`collect` records those). Writes nothing."""
    found = {}
    for experiment in batch_experiments(points):
        for waiting in unrecorded(experiment):
            point = waiting.point_dir.point()
            found[(point["experiment"], point["config_hash"])] = waiting
    return found


def queue_for(cfg, processes: int, devices: int):
    """The queue of a job of `processes` ranks driving `devices` devices on `cfg.nodes` nodes (launchers.site_rules);
    None where the cluster lists no queues."""
    nodes, gpus = cfg.nodes, 0 if cfg.cluster.device == "cpu" else devices
    return site_rules.job_queue(cfg.cluster, nodes, math.ceil(processes / nodes), math.ceil(gpus / nodes))


def point_queue(point: Point):
    return queue_for(point.cfg, point.processes, point.layout.devices)


def check_site(cfg, processes: int, devices: int) -> str | None:
    """ConfigError, one line, where the cluster takes no job of `processes` ranks driving `devices` devices on
    `cfg.nodes` nodes (a retired machine, no queue that takes it); the line naming a file its compute nodes would
    not see, else None."""
    site_rules.check_in_service(cfg.cluster)
    queue_for(cfg, processes, devices)
    return site_rules.unshared_path(batch_job("check", cfg, ()))


def check_submittable(points: list[Point], dry_run: bool) -> None:
    """Before anything runs: each batch point's site takes its job (a machine in service, a queue that fits), and,
    unless `dry_run`, the scheduler's submit command is here (a cluster's login node) and the job's files are where
    the compute nodes see them (a dry run only says so: its scripts may be written anywhere)."""
    unshared = set()
    for point in (p for p in points if is_batch(p)):
        try:
            unshared.add(check_site(point.cfg, point.processes, point.layout.devices))
        except ConfigError as e:
            raise ConfigError(f"{point.label}: {e}") from e
    unshared.discard(None)
    for problem in sorted(unshared) if dry_run else ():
        print(f"warning: {problem} (a submission is refused)", file=sys.stderr)
    if dry_run:
        return
    for name in sorted({p.cfg.cluster.scheduler for p in points if is_batch(p)}):
        command = BATCH_SCHEDULERS[name].submit_command
        if not shutil.which(command):
            raise ConfigError(f"{command} not found: submit from a login node of the {name} cluster "
                              "(DRY_RUN=1 / --dry-run writes the job scripts without submitting)")
    if unshared:
        raise ConfigError(min(unshared))


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
    job = Job(name, cfg.cluster, steps, jobs_dir / f"{name}.sh", jobs_dir / f"{name}.out", sys.executable,
              REPO_ROOT, env)
    return site_rules.with_queue(job) if steps else job


def _job(name: str, points: list[tuple[Point, PointDir]]) -> Job:
    cfg = points[0][0].cfg
    queue = point_queue(points[0][0])  # the job's points share it (`submit`); given by their GPUs, not only ranks
    if queue is not None:
        cfg = OmegaConf.merge(cfg, {"cluster": {"job": {"queue": queue.name}}})
    steps = tuple(Step(point_dir.path, point.label, point.processes, point.cfg.nodes, rank_threads(cfg),
                       point.rank_launcher, point.layout.devices // point.processes)
                  for point, point_dir in points)
    return batch_job(name, cfg, steps)


def submit(items: list[tuple[str, Point]], store: Store, dry_run: bool, parent_run_id: str | None = None,
           predict: Predict = no_prediction, unpredicted: set[str] | None = None) -> list[Outcome]:
    """Submit the points (position, point) as jobs of `cluster.job.points_per_job` points of one cluster and queue
    each (more where the queue lets a user have fewer jobs at once) and return at once; with `dry_run`, only write
    the job scripts. A job the scheduler refuses is recorded as failed. Each point's directory carries `predict`'s
    metrics for it, recorded with its run (`unpredicted`: why points went without one, said once)."""
    unpredicted = set() if unpredicted is None else unpredicted
    if not dry_run:  # created once here, not by many jobs at the same moment
        for experiment in {point.cfg.tracking.experiment for _, point in items}:
            store.experiment_id(experiment)
    by_queue: dict[tuple[str, str | None], list[tuple[str, Point]]] = {}
    for position, point in items:
        queue = point_queue(point)
        by_queue.setdefault((point.cfg.cluster.name, queue and queue.name), []).append((position, point))
    outcomes = []
    for (cluster, _), group in by_queue.items():
        configured = group[0][1].cfg.cluster.job.points_per_job
        queue = point_queue(group[0][1])
        per_job = site_rules.points_per_job(queue, configured, len(group))
        if per_job > configured:
            print(f"queue {site_rules.span(queue)} of cluster {cluster}: its {len(group)} point(s) go "
                  f"{per_job} to a job, one after another within the job's time limit", flush=True)
        for first in range(0, len(group), per_job):
            outcomes += _submit_job(group[first:first + per_job], store, dry_run, parent_run_id,
                                    lambda position, p: prediction_for(predict, p, position, unpredicted))
    return outcomes


def _submit_job(chunk: list[tuple[str, Point]], store: Store, dry_run: bool, parent_run_id: str | None,
                predicted: Callable[[str, Point], dict[str, float]]) -> list[Outcome]:
    scheduler = BATCH_SCHEDULERS[chunk[0][1].cfg.cluster.scheduler]
    dirs = [PointDir(point_dir_path(p)) if dry_run else new_point_dir(p, parent_run_id, predicted(position, p))
            for position, p in chunk]
    name = dirs[0].path.name + (f"+{len(chunk) - 1}" if len(chunk) > 1 else "")
    job = _job(name, [(p, point_dir) for (_, p), point_dir in zip(chunk, dirs)])
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
        return [Outcome(point, Status.failed, str(e),
                        record_ended(point_dir, store, refused, time.time(), time.time()).run_id, point_dir)
                for (_, point), point_dir in zip(chunk, dirs)]
    for point_dir in dirs:
        point_dir.write_job({"scheduler": scheduler.name, "job_id": job_id, "script": str(script),
                             "submitted": time.time()})
    print(f"{where} submitted: {scheduler.name} job {job_id} ({script})", flush=True)
    return [Outcome(point, "submitted", None, None, point_dir) for (_, point), point_dir in zip(chunk, dirs)]
