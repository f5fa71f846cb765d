"""The MLflow store: one run per point, with the names of the contract (DESIGN.md section 2)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import getpass
import hashlib
import itertools
import json
import logging
import os
import sqlite3
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from suite.errors import ConfigError
from suite.owner import Owner
from suite.paths import results_dir
from suite.records.tracking_server import credentials_file, export_credentials
from suite.vocabulary import (
    DEVICE_MEMORY,
    EFFECTIVE_PREFIX,
    EPOCH_METRICS,
    MEMORY_SPLIT,
    SUMMARY_DETAILS,
    SUMMARY_METRICS,
    TRACE_BREAKDOWN,
    Status,
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


class StoreError(ConfigError):
    """A store that cannot be used as it is (damaged, unreachable, impossible to create): one line saying why and
    what to do. Raised when it is opened, before anything is launched or written."""


SERVER_TIMEOUT_S = 5  # MLflow's own client retries an unreachable server for minutes, silently


def sqlite_file(uri: str) -> Path | None:
    """The file of a sqlite store; None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def backup_file(db: Path) -> Path:
    """The copy of a sqlite store that each sweep takes before writing to it (Store.back_up)."""
    return db.with_name(f"{db.name}.bak")


def read_only(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=60)


def check_intact(db: Path) -> None:
    """Raise StoreError if the sqlite file is damaged (a truncated or overwritten file), with the way back."""
    try:
        with contextlib.closing(read_only(db)) as connection:
            problems = [row[0] for row in connection.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as e:
        if e.sqlite_errorcode & 0xFF not in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            raise  # busy, unreadable, ...: not damage
        problems = [str(e)]
    if problems == ["ok"]:
        return
    backup = backup_file(db)
    if backup.exists():
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(backup.stat().st_mtime))
        way_back = (f"Restore the copy taken when a sweep last started ({taken}): "
                    f"mv {db} {db}.damaged && cp {backup} {db}")
    else:
        recovered = db.with_name(f"{db.stem}.recovered{db.suffix}")
        way_back = f"Salvage what is left: sqlite3 {db} .recover | sqlite3 {recovered} && mv {recovered} {db}"
    raise StoreError(f"the store {db} is damaged ({problems[0]}); nothing was written to it. {way_back}")


def check_reachable(uri: str) -> None:
    """Raise StoreError unless the tracking server at `uri` answers within SERVER_TIMEOUT_S (any HTTP answer)."""
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        pass  # it answered
    except OSError as e:  # refused, unknown host, timed out
        reason = getattr(e, "reason", e)
        if not isinstance(reason, ssl.SSLError):  # a certificate not trusted here is an answer too
            raise StoreError(f"the tracking server {uri} does not answer ({reason}): start it (`make mlflow-server`) "
                             "or set tracking.uri / MLFLOW_TRACKING_URI to one that runs") from None


def check_authorized(uri: str) -> None:
    """Raise StoreError if the tracking server at `uri` refuses the credentials this process sends (its first
    answer may take a while: a server just started, a password hash checked)."""
    request = urllib.request.Request(f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1")
    username, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if username and password:
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(
            f"{username}:{password}".encode()).decode())
    try:
        urllib.request.urlopen(request, timeout=60).close()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            sent = f"the credentials of user {username}" if username else "no credentials"
            raise StoreError(f"the tracking server {uri} refuses {sent}: the suite's own (`make mlflow-server`) "
                             f"takes those in {credentials_file()}; for another, set MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD") from None
    except OSError:
        pass  # it answered /health a moment ago: MLflow's client says what is wrong when it is used


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def run_params(cfg: DictConfig, knobs: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """The flattened config, plus the short names the contract promises, the point's layout (degrees and
    batches, see suite.layout) and the strategy's own knobs."""
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    params.update(dataset=cfg.dataset.name, network=cfg.network.name, strategy=cfg.strategy.name, **layout)
    for knob, value in knobs.items():
        params.setdefault(knob, value)
    return params


INCOMPLETE = "incomplete"  # the status of a point's run whose recording stopped part-way (a full disk, a crash)
# The status of a point's run whose params are no longer those it was recorded with (its store edited by hand): its
# config hash no longer says what it measured, so neither the report nor a resumed sweep trusts it.
INCONSISTENT = "inconsistent"
PARAMS_DIGEST = "suite.params_digest"
# The tags that say how a point ended: Store.write_run writes them after everything else, just before it ends the run.
VERDICT = ("suite.status", "suite.error")
# A run write that another writer's lock holds up past sqlite's busy timeout (MLflow sets 20 s on every session)
# is made again whole, this many times at most, after pauses of RETRY_AFTER_S, twice that, ...
WRITE_ATTEMPTS = 4
RETRY_AFTER_S = 2.0


def params_digest(params: dict[str, Any]) -> str:
    """A digest of a run's params as MLflow keeps them (strings), recorded with the run and checked when it is read."""
    return hashlib.sha256(json.dumps(sorted((k, str(v)) for k, v in params.items())).encode()).hexdigest()[:16]


def complete(run) -> bool:
    """Whether a point's run was recorded to the end: Store.write_run writes its verdict (`suite.status`) and then
    ends it (`ended_as`), last of all; a run ended without its verdict (KILLED by a recorder that found it
    half-written) is not."""
    return run.info.status in ("FINISHED", "FAILED", "KILLED") and "suite.status" in run.data.tags


def ended_as(tags: dict[str, str]) -> str:
    """MLflow's status of a point's run: FINISHED, KILLED where the sweep was stopped during it (`suite.interrupted`:
    Ctrl-C or a scheduler's SIGTERM; its `suite.status` says failed or timeout), else FAILED."""
    if tags["suite.status"] == Status.finished:
        return "FINISHED"
    return "KILLED" if "suite.interrupted" in tags else "FAILED"


def locked(exc: BaseException | None) -> bool:
    """Whether a store operation failed because another writer held the sqlite file's lock."""
    while exc is not None:
        if isinstance(exc, sqlite3.OperationalError) and \
                exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def source_tags(git_sha: str) -> dict[str, str]:
    """MLflow's standard run metadata, which its UI shows in the Source, Version and User columns: the code (the
    suite's commit, left out where it is unknown: an installed wheel), what ran it, and who."""
    commit = {"mlflow.source.git.commit": git_sha} if git_sha != "unknown" else {}
    return {**commit, "mlflow.source.name": "suite", "mlflow.source.type": "LOCAL", "mlflow.user": user()}


def user() -> str:
    """Who runs this: the login name, else the uid (a container's user may have no name)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def run_status(run) -> str:
    """How a point ended as its run says (the `suite.status` tag); `incomplete` if the run is not complete,
    `inconsistent` if its params are not those it was recorded with."""
    if not complete(run):
        return INCOMPLETE
    digest = run.data.tags.get(PARAMS_DIGEST)  # runs recorded before the digest was have none
    if digest is not None and digest != params_digest(run.data.params):
        return INCONSISTENT
    return run.data.tags.get("suite.status", "?")


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
        """MLflow's client. Making one creates a sqlite store that does not exist, or upgrades its tables: under a
        lock beside the file, since two processes doing so at once both run MLflow's schema migrations, and one
        fails ("duplicate column")."""
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
            raise ValueError(f"summary metrics {sorted(undeclared)} are not declared in suite.vocabulary")
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
