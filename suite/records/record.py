"""A point directory becomes one MLflow run, exactly once, whoever gets there first. So does a calibration
job's directory (`make calibrate`), which also leaves its record (see suite.records.calibration).

The local driver records a point as soon as its ranks end. A batch job's last step for each point
(`python -m suite.records.record <point dir> --exit-code N --started T`) judges it and records it itself
into a tracking server (`cluster.job.record_in_job`); otherwise, or if that fails, it leaves what it saw in
`ended.json` for `make collect` on the login node, so that one process writes a sqlite store. `make
collect` records those points and the ones of jobs that ended without that step. Each recorder
claims the directory first, checks that the store has no complete run for it yet, and leaves
`recorded.json` behind.

Before it is recorded a point is judged: its status and one error line, from what its ranks left behind and how
their launcher ended. The same judgement serves a point run here (`launchers.local`), a batch job's own last step
(srun, jsrun, mpiexec) and `make collect`, which adds what the scheduler says about a job that ended unrecorded.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from launchers import LaunchResult
from launchers.batch import JobState
from suite.config import is_calibration
from suite.point_dir import PointDir, error_line
from suite.records.calibration import write_calibration
from suite.records.run_schema import complete, source_tags
from suite.records.store import Store, is_server, store_uri
from suite.runtime.rendezvous import scheduler_job_id
from suite.shared_names import Status

TIMEOUT_EXIT = 3  # tells the job script that the ranks were stopped by SIGTERM: start no further point

# Statuses a rank reports itself that say why the point failed; `timeout` only says that it was stopped.
OWN_FAILURES = (Status.failed, Status.oom, Status.invalid, Status.diverged)
SIGTERM = -15  # how launchers stop the ranks that survive a failure: never the cause
SIGABRT = -6
HOROVODRUN_EXIT = re.compile(r"^Process (\d+) exit with status code (\d+)\.$")
HOROVODRUN_STOPS_THE_OTHERS = "Terminating remaining workers after failure of Process"


def _horovodrun_failed_ranks(launcher_text: str) -> dict[int, int]:
    """horovodrun's `Process <rank> exit with status code <n>` lines (a shell's code: 128 + n is signal n).
    It stops the other ranks after the first failure, with SIGKILL once they are frozen; so a rank that
    ends after that announcement counts as stopped by SIGTERM."""
    found: dict[int, int] = {}
    stopping = False
    for line in launcher_text.splitlines():
        ended = HOROVODRUN_EXIT.match(line)
        if ended:
            code = int(ended.group(2))
            found.setdefault(int(ended.group(1)), SIGTERM if stopping else (128 - code if code > 128 else code))
        stopping = stopping or line.startswith(HOROVODRUN_STOPS_THE_OTHERS)
    return found


def _failed_ranks(launcher_text: str) -> dict[int, int]:
    """Exit code of each failed rank (negative: killed by that signal) from srun's
    `task <rank>: Exited with exit code <n>` / `task <rank>: Killed` lines or horovodrun's."""
    found: dict[int, int] = {}
    for rank, code, killed in re.findall(r"task (\d+): (?:Exited with exit code (\d+)|(Killed))", launcher_text):
        found.setdefault(int(rank), -9 if killed else int(code))
    return {**_horovodrun_failed_ranks(launcher_text), **found}


def _first_exception_line(launcher_text: str) -> str | None:
    """The first `SomeError: message` a worker printed before any error report could be written."""
    for line in launcher_text.splitlines():
        line = line.split("]: ", 1)[-1].strip()  # the local launcher prefixes worker output with [rank<i>]:
        line = re.sub(r"^\[\d+\]<std(?:out|err)>:", "", line)  # horovodrun with [<rank>]<stderr>:
        if re.match(r"^[\w.]*(Error|Exception)\b", line):
            return line
    return None


def _native_out_of_memory(launcher_text: str) -> str | None:
    """The C++ exception a rank aborted on (`terminate called after throwing ...`) when it is a failed
    allocation: std::bad_alloc, or a thread that got no memory for its stack (std::system_error, EAGAIN)."""
    thrown = None
    for line in launcher_text.splitlines():
        line = re.sub(r"^\[\d+\]<std(?:out|err)>:|^\[rank\d+\]: ", "", line).strip()
        started = re.match(r"terminate called after throwing an instance of '([\w:]+)'", line)
        if started:
            thrown = started.group(1)
        elif thrown and line.startswith("what():"):
            what = line.removeprefix("what():").strip()
            if thrown == "std::bad_alloc" or what == "Resource temporarily unavailable":
                return f"{thrown}: {what}"
            thrown = None
    return None


@dataclass(frozen=True)
class JobEnded:
    """A batch job that ended without recording its point, as its scheduler last saw it (None: forgotten)."""

    state: JobState | None


@dataclass(frozen=True)
class NotStarted:
    """The point's ranks never ran: the launcher broke, or the scheduler refused the job."""

    error: str


Ending = LaunchResult | JobEnded | NotStarted


def ended_status(point_dir: PointDir, ended: Ending) -> tuple[Status, str | None]:
    """Status and error line of a point, however it ended."""
    if isinstance(ended, NotStarted):
        return Status.failed, ended.error
    cfg = OmegaConf.load(point_dir.config)
    epochs = cfg.get("epochs")  # None: a job without epochs (a calibration)
    if isinstance(ended, JobEnded):
        return job_status(point_dir, ended.state, epochs)
    return launch_status(point_dir, ended, cfg.timeout_s, epochs)


def epochs_done(point_dir: PointDir, epochs: int | None) -> str:
    """` after k of n epochs` (with its leading space), or nothing for a job without epochs."""
    return "" if epochs is None else f" after {len(point_dir.epochs())} of {epochs} epochs"


def launch_status(point_dir: PointDir, result: LaunchResult, timeout_s: float,
                  epochs: int | None) -> tuple[str, str | None]:
    """Status and error line of a point from what its workers left behind and how the launcher ended."""
    if result.timed_out:
        return Status.timeout, (f"no result after timeout_s={timeout_s:g} s; "
                                f"the point was stopped{epochs_done(point_dir, epochs)}")
    if result.stopped_by == "SIGTERM":
        return Status.timeout, f"the sweep got SIGTERM (a time limit or a preemption){epochs_done(point_dir, epochs)}"
    if result.stopped_by:
        return (Status.failed,
                f"interrupted ({result.stopped_by}){epochs_done(point_dir, epochs)}: the sweep was stopped")
    if result.returncode == 0 and point_dir.summary() is not None:
        return Status.finished, None
    text = point_dir.launcher_log.read_text(errors="replace") if point_dir.launcher_log.exists() else ""
    errors = point_dir.errors()  # earliest first: the first is the root cause, the others its consequences
    failed = result.failed_ranks or _failed_ranks(text)
    reported = {e["rank"] for e in errors}
    # A rank killed by a signal cannot report; the errors of the others are then consequences of its death.
    # SIGTERM is how launchers stop the surviving ranks, so it is never the cause, nor a signal this launcher sent.
    causes = {rank: code for rank, code in failed.items() if code != SIGTERM and rank not in result.stopped_ranks}
    killed = [rank for rank, code in causes.items() if code < 0 and rank not in reported]
    killed.sort(key=lambda rank: (failed[rank] != -9, rank))
    if errors and not killed:
        first = errors[0]
        detail = epochs_done(point_dir, epochs) if first["status"] == Status.timeout else ""
        return first["status"], f"rank {first['rank']}: {first['error']}{detail}"
    rank = killed[0] if killed else next(iter(causes), next(iter(failed), None))
    code = failed.get(rank, result.returncode)
    who = "a worker" if rank is None else f"rank {rank}"
    if code == -9:
        return Status.oom, f"{who} was killed by SIGKILL (most likely the kernel's out-of-memory killer)"
    native = _native_out_of_memory(text) if code == SIGABRT else None
    if native:
        return Status.oom, f"{who} aborted on {native} (out of memory)"
    died = f"killed by signal {-code}" if code and code < 0 else f"exited with code {code}"
    exception = _first_exception_line(text)
    detail = f": {exception}" if exception else " without an error report (see its log)"
    return Status.failed, f"{who} {died}{detail}"


def job_status(point_dir: PointDir, state: JobState | None, epochs: int | None) -> tuple[str, str | None]:
    """A batch job that ended without recording its point: the ranks' own evidence where it is decisive,
    else the scheduler's verdict on the job (`state`; None when the scheduler no longer knows it)."""
    if point_dir.summary() is not None:
        return Status.finished, None
    own = [e for e in point_dir.errors() if e["status"] in OWN_FAILURES]
    if own:
        return own[0]["status"], f"rank {own[0]['rank']}: {own[0]['error']}"
    job = point_dir.job() or {}
    where = f"{job.get('scheduler', 'batch')} job {job.get('job_id', '?')}"
    if state is None:
        done = epochs_done(point_dir, epochs)
        return Status.failed, f"{where} ended without recording the point and its scheduler no longer knows it" + \
            (f" ({done.strip()})" if done else "")
    status = Status.failed if state.status in (None, Status.finished) else state.status
    return status, f"{where} ended {state.detail}{epochs_done(point_dir, epochs)}"


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
