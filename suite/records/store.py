"""The MLflow store: one run per point, with the names of the contract (DESIGN.md section 2)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from suite.paths import results_dir
from suite.point_dir import Owner
from suite.records.run_schema import PARAMS_DIGEST, VERDICT, ended_as, params_digest, source_tags
from suite.records.store_health import (
    StoreError,
    backup_file,
    check_authorized,
    check_intact,
    check_reachable,
    read_only,
    sqlite_file,
    start_from_empty,
)
from suite.records.tracking_server import export_credentials
from suite.shared_names import (
    DEVICE_MEMORY,
    EFFECTIVE_PREFIX,
    EPOCH_METRICS,
    MEMORY_SPLIT,
    SUMMARY_DETAILS,
    SUMMARY_METRICS,
    TRACE_BREAKDOWN,
)

# MLflow 3 opens an experiment without this tag on its GenAI overview of traces; this kind opens the runs table.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# Summary details holding one entry per rank: the metrics recorded from each as <name>_rank<i>.
PER_RANK = {"memory_by_rank": ("peak_memory_mb", *MEMORY_SPLIT, *DEVICE_MEMORY),
            "breakdown_by_rank": TRACE_BREAKDOWN}


def tracking_uri(configured: str | None = None, cluster_default: str | None = None) -> str:
    """`tracking.uri=`, else $MLFLOW_TRACKING_URI, else the cluster's tracking server, else the sqlite file."""
    return (configured or os.environ.get("MLFLOW_TRACKING_URI") or cluster_default
            or f"sqlite:///{results_dir() / 'mlflow.db'}")


def store_uri(cfg: DictConfig) -> str:
    """The store a point reports to."""
    return tracking_uri(cfg.tracking.uri, cfg.cluster.get("tracking_uri"))


def is_server(uri: str) -> bool:
    """Whether the store is a tracking server (else a file that this process writes itself)."""
    return uri.startswith(("http://", "https://"))


# A run write that another writer's lock holds up past sqlite's busy timeout (MLflow sets 20 s on every session)
# is made again whole, this many times at most, after pauses of RETRY_AFTER_S, twice that, ...
WRITE_ATTEMPTS = 4
RETRY_AFTER_S = 2.0


def locked(exc: BaseException | None) -> bool:
    """Whether a store operation failed because another writer held the sqlite file's lock."""
    while exc is not None:
        if isinstance(exc, sqlite3.OperationalError) and \
                exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return True
        exc = exc.__cause__ or exc.__context__
    return False



class Store:
    def __init__(self, uri: str | None = None, create: bool = True) -> None:
        """The store at `uri` (default: tracking_uri()), checked: a tracking server must answer, a sqlite file must
        be intact. A sqlite file that does not exist is created, or with `create=False` left alone until something
        is written: until then it reads as empty."""
        self.uri = tracking_uri(uri)
        self.path = sqlite_file(self.uri)
        if is_server(self.uri):
            export_credentials()
            check_reachable(self.uri)
            check_authorized(self.uri)
        elif self.path and self.path.exists():
            check_intact(self.path)
        if self.path and (create or self.path.exists()):
            self.client.search_experiments(max_results=1)  # MLflow makes or upgrades its tables now, not mid-sweep

    def make_directory(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            nearest = next(p for p in self.path.parents if p.exists())
            reason = f"{nearest} is a file, not a directory" if not nearest.is_dir() else f"{e.strerror}: {e.filename}"
            raise StoreError(f"cannot create the store {self.uri}: {reason}") from None

    @functools.cached_property
    def client(self) -> MlflowClient:
        """MLflow's client. Making one creates a sqlite store that does not exist (a copy of the environment's empty
        store, else by MLflow's schema migrations), or upgrades its tables: under a lock beside the file, since two
        processes doing so at once both run the migrations, and one fails ("duplicate column")."""
        if not self.path:
            return MlflowClient(tracking_uri=self.uri)
        self.make_directory()
        # Its "Creating initial MLflow database tables..." lines are not the suite's: stderr holds the suite's lines.
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
        try:
            lock = open(self.path.with_name(f"{self.path.name}.lock"), "a")
        except OSError as e:
            raise StoreError(f"cannot write in the results directory {self.path.parent} ({e.strerror}): the store "
                             "and every point's files go there; make it writable or set SUITE_RESULTS_DIR") from None
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.path.exists():
                start_from_empty(self.path)
            return MlflowClient(tracking_uri=self.uri)

    def empty(self) -> bool:
        """Whether there is nothing to read: a sqlite store that does not exist (yet)."""
        return bool(self.path) and not self.path.exists()

    def back_up(self) -> Path | None:
        """Copy a sqlite store to backup_file() (sqlite's online backup: consistent while others write), the
        copy a damaged store's message points to; the copy (None: not a sqlite store, or none yet)."""
        if not (self.path and self.path.exists()):
            return None
        backup = backup_file(self.path)
        partial = backup.with_name(f"{backup.name}.{os.getpid()}")
        try:
            with contextlib.closing(read_only(self.path)) as source, \
                    contextlib.closing(sqlite3.connect(partial)) as copy:
                source.backup(copy)
            os.replace(partial, backup)
        except (OSError, sqlite3.Error) as e:
            partial.unlink(missing_ok=True)
            raise StoreError(f"cannot back up the store {self.path} to {backup} ({e}); nothing was run") from None
        return backup

    def experiment_names(self) -> list[str]:
        return [] if self.empty() else [e.name for e in self.client.search_experiments()]

    def experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:") or self.uri.startswith("file:") or "://" not in self.uri:
            location = (results_dir() / "artifacts" / name).as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
        except MlflowException:  # another writer created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if not found:
                raise
            return found.experiment_id

    def start_sweep_run(self, experiment: str, sweep: str, command: str, git_sha: str) -> str:
        """The parent run of one sweep invocation: its points' runs are its children, its report its artifacts."""
        experiment_id = self.experiment_id(experiment)
        for key, value in EXPERIMENT_KIND.items():  # experiments created before the tag existed
            self.client.set_experiment_tag(experiment_id, key, value)
        # Its owner, the driver's process: a run it leaves RUNNING once gone is ended by the next one that looks.
        tags = {"suite.sweep": sweep, "suite.command": command, "suite.owner": str(Owner.me()), **source_tags(git_sha)}
        run = self.client.create_run(experiment_id, run_name=f"sweep {sweep} {time.strftime('%Y-%m-%d %H:%M:%S')}",
                                     tags=tags)
        return run.info.run_id

    def end_abandoned_sweep_runs(self, experiment: str) -> list:
        """End as KILLED each sweep invocation's run left RUNNING by a driver that is gone (SIGKILL, a crash),
        as of the last time it was seen at work: the latest end (or start) of its points' runs, else its own
        start. The runs so ended, as they are now."""
        ended = []
        for run in self.runs(experiment, "attributes.status = 'RUNNING'"):
            owner = Owner.parse(run.data.tags.get("suite.owner"))
            if "suite.sweep" not in run.data.tags or owner is None or not owner.gone():
                continue
            children = self.runs(experiment, f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
            last_seen = max([run.info.start_time, *(c.info.end_time or c.info.start_time for c in children)])
            self.client.set_tag(run.info.run_id, "suite.error",
                                f"its driver (pid {owner.pid} on {owner.host}) ended without finishing it")
            self.client.set_terminated(run.info.run_id, "KILLED", end_time=last_seen)
            ended.append(self.client.get_run(run.info.run_id))
        return ended

    def finish_sweep_run(self, run_id: str, report_dir: Path | None, status: str,
                         params: dict[str, str] | None = None, metrics: dict[str, float] | None = None) -> None:
        """End a sweep invocation's run as `status` (FINISHED, FAILED: a point did not finish, KILLED: stopped) with
        what the sweep ran (`params`), how it ended (`metrics`: points finished, failed, the best speedup) and its
        report as artifacts (report.html shows it with its figures in the UI)."""
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), int(time.time() * 1000), 0)
                                               for k, v in (metrics or {}).items()],
                              params=[Param(k, str(v)) for k, v in (params or {}).items()])
        if report_dir is not None:
            self.client.log_artifacts(run_id, str(report_dir), "report")
        self.client.set_terminated(run_id, status)

    def log_point_metric(self, values: dict[str, float], name: str) -> None:
        """One metric on each of these runs (by run id), e.g. the `speedup` a sweep's report computes."""
        for run_id, value in values.items():
            self.client.log_metric(run_id, name, value)

    def runs(self, experiment: str, filter_string: str = "") -> list:
        if self.empty():
            return []
        found = self.client.get_experiment_by_name(experiment)
        if not found:
            return []
        return self.client.search_runs([found.experiment_id], filter_string, max_results=50000,
                                       order_by=["attributes.start_time DESC"])

    def finished_run(self, experiment: str, config_hash: str):
        """The newest complete run of the point that finished."""
        runs = self.runs(experiment, f"tags.`suite.config_hash` = '{config_hash}' and tags.`suite.status` = 'finished' "
                                     "and attributes.status = 'FINISHED'")
        return runs[0] if runs else None

    def latest_run(self, experiment: str, config_hash: str):
        runs = self.runs(experiment, f"tags.`suite.config_hash` = '{config_hash}'")
        return runs[0] if runs else None

    def speaking_run(self, experiment: str, config_hash: str):
        """The run that speaks for a point: its newest finished run, else its newest run, complete or not (None:
        never run)."""
        return self.finished_run(experiment, config_hash) or self.latest_run(experiment, config_hash)

    def runs_for_point_dir(self, experiment: str, point_dir: str) -> list:
        return self.runs(experiment, f"tags.`suite.point_dir` = '{point_dir}'")

    def record(self, experiment: str, name: str, params: dict[str, Any], tags: dict[str, str],
               epochs: list[dict], summary: dict[str, Any], artifacts: list[Path],
               start_time: float, end_time: float) -> str:
        """Write one complete run of a point; a new run every time, nothing existing is touched."""
        undeclared = summary.keys() - {*SUMMARY_METRICS, *SUMMARY_DETAILS}
        if undeclared:  # a metric the contract does not name would be lost: say so instead
            raise ValueError(f"summary metrics {sorted(undeclared)} are not declared in suite.shared_names")
        now = int(time.time() * 1000)
        # an epoch's metrics stamped when it ended (its `ended_at`, unix seconds; runs recorded before it: now)
        metrics = [Metric(k, float(e[k]), int(1000 * e["ended_at"]) if "ended_at" in e else now, int(e["epoch"]))
                   for e in epochs for k in EPOCH_METRICS if k in e]
        metrics += [Metric(k, float(summary[k]), now, 0) for k in SUMMARY_METRICS if k in summary]
        metrics += [Metric(k, float(v), now, 0) for k, v in summary.get("strategy_metrics", {}).items()]
        metrics += [Metric("step_loss", float(v), now, i) for i, v in enumerate(summary.get("step_losses", []))]
        for detail, keys in PER_RANK.items():
            for rank, values in enumerate(summary.get(detail, [])):
                metrics += [Metric(f"{key}_rank{rank}", float(values[key]), now, 0) for key in keys if key in values]
        effective = {f"{EFFECTIVE_PREFIX}{k}": v for k, v in summary.get("run_params", {}).items()}
        return self.write_run(experiment, name, {**params, **effective}, {**summary.get("run_tags", {}), **tags},
                              metrics, artifacts, start_time, end_time)

    def write_run(self, experiment: str, name: str, params: dict[str, Any], tags: dict[str, str],
                  metrics: list[Metric], artifacts: list[Path], start_time: float, end_time: float) -> str:
        """Write one complete run, ended as its `suite.status` tag says; its id. A write that the sqlite file's lock
        stops is made again whole (WRITE_ATTEMPTS), each run it left half-written ended first (KILLED)."""
        half_written: list[str] = []
        for attempt in itertools.count(1):
            try:
                while half_written:
                    self.client.set_terminated(half_written[0], "KILLED")
                    half_written.pop(0)
                return self._write_run(experiment, name, params, tags, metrics, artifacts, start_time, end_time,
                                       half_written)
            except MlflowException as e:
                if attempt == WRITE_ATTEMPTS or not locked(e):
                    raise
            time.sleep(RETRY_AFTER_S * 2 ** (attempt - 1))

    def _write_run(self, experiment: str, name: str, params: dict[str, Any], tags: dict[str, str],
                   metrics: list[Metric], artifacts: list[Path], start_time: float, end_time: float,
                   half_written: list[str]) -> str:
        """One attempt of write_run; the run it creates goes into `half_written`, for write_run to end if the attempt
        stops. The run carries the point's identity from the start (so that the next recorder finds and ends it if
        the process stops too), its verdict only at the end: a run cut short never reads as a point that finished."""
        run_id = self.client.create_run(self.experiment_id(experiment), start_time=int(start_time * 1000),
                                        run_name=name, tags={**{k: v for k, v in tags.items() if k not in VERDICT},
                                                             PARAMS_DIGEST: params_digest(params)}).info.run_id
        half_written.append(run_id)
        self.client.log_batch(run_id, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()])
        for path in artifacts:
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), path.name)
            elif path.exists():
                self.client.log_artifact(run_id, str(path))
        self.client.log_batch(run_id, tags=[RunTag(k, tags[k]) for k in VERDICT if k in tags])
        self.client.set_terminated(run_id, ended_as(tags), end_time=int(end_time * 1000))
        return run_id
