"""Faults that would lose or misreport a run: a recorder killed outright or stopped by a full disk, another writer
holding the sqlite store's lock, a sweep killed outright. Each leaves a state that the next recorder, sweep or
`make status` recognises and repairs. And how a batch job's last step leaves a sqlite store to `make collect`.

A full disk without root: the recorder runs under RLIMIT_FSIZE, so that a write past the limit fails with EFBIG
(SIGXFSZ ignored), the same OSError path as ENOSPC on a full disk.
"""

import os
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException

from analysis.runs import latest_per_point
from conftest import DIGITS, copy_rank_outputs, run_suite
from launchers import LaunchResult
from suite.errors import Stopped
from suite.paths import REPO_ROOT, git_sha
from suite.point_dir import Owner, PointDir
from suite.records import store as store_module
from suite.records.record import record_ended
from suite.records.run_schema import INCOMPLETE, VERDICT, run_status
from suite.records.store import Store
from suite.sweep import jobs
from suite.sweep.driver import skip_reason
from suite.sweep.plan import Point, new_point_dir, plan
from suite.sweep.status import status_rows

DISK_FULL = "not recorded (OSError: [Errno 27] File too large"  # EFBIG; on a full disk: [Errno 28] No space left


def holder(out: PointDir) -> subprocess.Popen:
    """A recorder that claimed the point and then waits (until its stdin closes)."""
    code = ("import sys; from suite.point_dir import PointDir; "
            f"assert PointDir({str(out.path)!r}).claim(); print('claimed', flush=True); sys.stdin.read()")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "claimed\n"
    return process


def test_the_recorder_of_a_jobs_point_does_not_import_torch():
    """Every batch job ends each point with `python -m suite.records.record`: torch's import (2 s of CPU) is not
    part of writing a run."""
    probe = "import sys; import suite.records.record; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout == "False\n", result.stdout + result.stderr


def test_a_claim_whose_recorder_is_gone_is_taken_over_at_once(tmp_path):
    out = PointDir(tmp_path)
    recorder = holder(out)
    owner = Owner.parse(out.claim_file.read_text())
    assert (owner.host, owner.pid) == (Owner.me().host, recorder.pid)
    assert not out.claim()  # its recorder is at work
    recorder.kill()  # SIGKILL: no `finally` releases the claim
    recorder.communicate()
    assert out.claim_file.exists()
    assert out.claim()  # taken over at once, not after 15 minutes
    assert Owner.parse(out.claim_file.read_text()) == Owner.me()
    out.release()
    out.claim_file.write_text("")  # as left by a recorder whose write of its claim failed on a full disk
    assert out.claim()
    out.claim_file.write_text(f"elsewhere {recorder.pid}\n")  # a recorder on another host cannot be seen from here
    assert not out.claim()
    assert out.claim(stale_after_s=0)  # ... until its claim is stale


def point_dir(worker_outputs, *overrides: str) -> tuple[Point, PointDir]:
    """A planned point whose directory holds what a real rank left behind, to be recorded (in `results`)."""
    (point,) = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2", *overrides]])
    out = new_point_dir(point)
    copy_rank_outputs(worker_outputs, out.path)
    return point, out


IN_JOB = "cluster.job.record_in_job=true"  # a site whose jobs record their points into the sqlite store themselves


def full_disk(file_size_limit: int) -> None:
    """In a child process before it starts: no file can grow past `file_size_limit` bytes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write that fails, not a process killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))


def record(out: PointDir, file_size_limit: int | None = None, exit_code: int = 0) -> subprocess.CompletedProcess:
    """A batch job's last step, `python -m suite.records.record`, after the ranks' command ended with `exit_code`;
    here on a disk that is full after `file_size_limit` bytes of any one file."""
    return subprocess.run([sys.executable, "-m", "suite.records.record", str(out.path), "--exit-code", str(exit_code),
                           "--started", str(time.time())], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=None if file_size_limit is None else lambda: full_disk(file_size_limit))


@pytest.mark.slow
@pytest.mark.xdist_group("recording_faults")  # one worker runs these: the rank of worker_outputs runs once
def test_a_disk_full_at_the_claim_leaves_no_claim_and_the_rerun_records_the_point(results, store, worker_outputs):
    _, out = point_dir(worker_outputs, IN_JOB)
    stopped = record(out, file_size_limit=0)  # no room at all: the claim is the recorder's first write
    assert stopped.returncode == 1 and DISK_FULL in stopped.stdout, stopped.stdout + stopped.stderr[-3000:]
    assert list(out.path.glob("recording.claim*")) == []
    again = record(out)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    (run,) = store.runs("adhoc")
    assert out.recorded()["run_id"] == run.info.run_id and run.info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.xdist_group("recording_faults")
def test_a_run_cut_short_by_a_full_disk_is_incomplete_and_the_point_is_recorded_again(results, store, worker_outputs):
    point, out = point_dir(worker_outputs, IN_JOB)
    store.experiment_id("adhoc")
    # Room for the store's few new pages, not for the rank's profiler trace: the disk fills while it is copied.
    limit = (results / "mlflow.db").stat().st_size + (2 << 20)
    trace = out.rank_trace(0)
    trace.parent.mkdir()
    trace.write_bytes(os.urandom(2 * limit))
    cut = record(out, limit)
    assert cut.returncode == 1 and DISK_FULL in cut.stdout, cut.stdout + cut.stderr[-3000:]
    assert list(out.path.glob("recording.claim*")) == []  # released all the same
    (run,) = store.runs("adhoc")
    assert run.info.status == "RUNNING" and run.data.tags["suite.point_dir"] == str(out.path)  # as the disk left it
    assert "suite.status" not in run.data.tags  # the verdict is written last: a run cut short never has it
    assert run_status(run) == INCOMPLETE and store.finished_run("adhoc", point.config_hash) is None
    assert status_rows([point], store) == [(point.label, "incomplete", "1/1", "-",
                                            f"run {run.info.run_id}: recording stopped part-way")]
    assert skip_reason(store.speaking_run("adhoc", point.config_hash), git_sha(REPO_ROOT), False, False) is None
    assert [row.status for row in latest_per_point([run])] == [INCOMPLETE]  # the report: not a finished point

    again = record(out)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    runs = {r.info.status: r for r in store.runs("adhoc")}
    assert runs.keys() == {"KILLED", "FINISHED"} and runs["KILLED"].info.run_id == run.info.run_id
    complete = store.finished_run("adhoc", point.config_hash)
    assert complete.info.run_id == runs["FINISHED"].info.run_id == out.recorded()["run_id"]
    (copied,) = store.client.list_artifacts(complete.info.run_id, "traces")
    assert copied.file_size == trace.stat().st_size
    assert status_rows([point], store)[0][1] == "finished"
    assert [row.run_id for row in latest_per_point(store.runs("adhoc"))] == [complete.info.run_id]


class WriteLock:
    """Another writer of the sqlite store (another job's recorder, `make collect`): a connection of its own holding the
    store's write lock, as a transaction of that writer does."""

    def __init__(self, db: Path) -> None:
        self.connection = sqlite3.connect(db, isolation_level=None, check_same_thread=False)

    def take(self, hold_s: float | None = None) -> None:
        """Hold it for `hold_s` seconds (None: until release())."""
        self.connection.execute("BEGIN IMMEDIATE")
        if hold_s is not None:
            threading.Timer(hold_s, self.release).start()

    def release(self) -> None:
        self.connection.execute("ROLLBACK")


def lock_after_create_run(monkeypatch, store: Store, lock: WriteLock, hold_s: float | None) -> None:
    """The moment of the review's failure: `lock` taken right after the recorder creates its run, before its params
    and metrics are written."""
    create_run = store.client.create_run

    def create_then_lock(*args, **kwargs):
        run = create_run(*args, **kwargs)
        monkeypatch.setattr(store.client, "create_run", create_run)  # once
        lock.take(hold_s)
        return run

    monkeypatch.setattr(store.client, "create_run", create_then_lock)


RANKS_ENDED = LaunchResult(0, False, 1.0)


@pytest.mark.slow
@pytest.mark.xdist_group("recording_faults")
def test_a_run_write_the_store_lock_stops_is_made_again_whole(results, store, worker_outputs, monkeypatch):
    point, out = point_dir(worker_outputs)
    store.experiment_id("adhoc")
    # Held past sqlite's busy timeout (MLflow's 20 s): the params and metrics of the first write fail.
    lock_after_create_run(monkeypatch, store, WriteLock(store.path), hold_s=25)
    done = record_ended(out, store, RANKS_ENDED, time.time() - 1, time.time())
    runs = {r.info.status: r for r in store.runs("adhoc")}
    assert runs.keys() == {"KILLED", "FINISHED"}
    half = runs["KILLED"]  # ended before the write was made again
    assert half.data.params == {} and half.data.metrics == {} and not half.data.tags.keys() & set(VERDICT)
    assert half.data.tags["suite.point_dir"] == str(out.path) and run_status(half) == INCOMPLETE
    whole = store.finished_run("adhoc", point.config_hash)
    assert whole.info.run_id == runs["FINISHED"].info.run_id == done.run_id == out.recorded()["run_id"]
    assert done.status == "finished" and "epoch_time_s_mean" in whole.data.metrics


@pytest.mark.slow
@pytest.mark.xdist_group("recording_faults")
def test_a_run_the_store_lock_leaves_half_written_is_never_adopted_and_collect_records_it(results, store,
                                                                                          worker_outputs, monkeypatch):
    point, out = point_dir(worker_outputs)
    store.experiment_id("adhoc")
    started, ended = time.time() - 1, time.time()
    out.write_job({"scheduler": "slurm", "job_id": "4242", "submitted": started})
    out.write_ended(0, started, ended)  # as the job's last step leaves it
    monkeypatch.setattr(store_module, "WRITE_ATTEMPTS", 1)  # one busy timeout, not every retry's
    lock = WriteLock(store.path)
    lock_after_create_run(monkeypatch, store, lock, hold_s=None)
    with pytest.raises(MlflowException, match="database is locked"):
        record_ended(out, store, RANKS_ENDED, started, ended)
    lock.release()
    assert out.recorded() is None and list(out.path.glob("recording.claim*")) == []
    (half,) = store.runs("adhoc")
    assert half.info.status == "RUNNING" and half.data.params == {} and not half.data.tags.keys() & set(VERDICT)
    assert store.finished_run("adhoc", point.config_hash) is None  # nothing adopted: `make sweep` runs it again
    assert skip_reason(store.speaking_run("adhoc", point.config_hash), git_sha(REPO_ROOT), False, False) is None

    assert jobs.collect() == []  # `make collect`: the job's verdict, without asking the scheduler
    runs = {r.info.status: r for r in store.runs("adhoc")}
    assert runs.keys() == {"KILLED", "FINISHED"} and runs["KILLED"].info.run_id == half.info.run_id
    assert out.recorded()["run_id"] == runs["FINISHED"].info.run_id
    assert runs["FINISHED"].data.tags["suite.job_id"] == "4242"
    assert status_rows([point], store)[0][1] == "finished"


@pytest.mark.slow
@pytest.mark.xdist_group("recording_faults")
def test_a_jobs_last_step_leaves_a_sqlite_store_to_collect_which_records_what_the_job_saw(results, worker_outputs):
    _, done = point_dir(worker_outputs)
    _, stopped = point_dir(worker_outputs)  # its rank got SIGTERM in its first epoch
    stopped.summary_file.unlink()
    stopped.write_error(0, Stopped("stopped by SIGTERM (a time limit, a preemption or a cancel)"))
    for job_id, out in (("7", done), ("8", stopped)):
        out.write_job({"scheduler": "slurm", "job_id": job_id, "submitted": time.time()})

    finished = record(done)
    assert finished.returncode == 0, finished.stdout + finished.stderr[-3000:]
    assert "finished (`make collect` on the login node records it into sqlite:///" in finished.stdout
    timeout = record(stopped, exit_code=143)
    assert timeout.returncode == 3, timeout.stdout + timeout.stderr[-3000:]  # the job script starts no further point
    assert "timeout: rank 0: Stopped: stopped by SIGTERM" in timeout.stdout
    assert not (results / "mlflow.db").exists()  # no job wrote the store
    assert done.ended()["exit_code"] == 0 and stopped.ended()["exit_code"] == 143

    assert jobs.collect() == []  # one process, on the login node
    store = Store()
    runs = {r.data.tags["suite.job_id"]: r.data.tags for r in store.runs("adhoc")}
    assert runs["7"]["suite.status"] == "finished"
    assert runs["8"]["suite.status"] == "timeout"  # the job's verdict, not the scheduler's
    assert runs["8"]["suite.error"] == ("rank 0: Stopped: stopped by SIGTERM (a time limit, a preemption or a cancel)"
                                        " after 1 of 1 epochs")
    assert jobs.collect() == [] and len(store.runs("adhoc")) == 2  # recorded once


@pytest.mark.slow
def test_a_sweep_killed_outright_is_ended_as_killed_when_it_stopped(results, store):
    # Its first point (single, one rank) hangs and is stopped, recorded as a timeout; the second (ddp, two ranks)
    # hangs until the driver is killed.
    sweep = ["--sweep", "digits", "fault.kind=hang", "timeout_s=10"]
    driver = subprocess.Popen([sys.executable, "-m", "suite", *sweep], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not list(results.glob("points/digits/*/logs/rank1.log")):
        assert driver.poll() is None and time.monotonic() < deadline, "the sweep did not reach its second point"
        time.sleep(0.5)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and its fork server: the ranks end with the server
    driver.wait()
    (parent,) = [r for r in store.runs("digits") if "suite.sweep" in r.data.tags]
    (point,) = [r for r in store.runs("digits") if "suite.sweep" not in r.data.tags]
    assert parent.info.status == "RUNNING"

    status = run_suite(*sweep, "--status")
    assert status.returncode == 0, status.stderr[-3000:]
    parent = store.client.get_run(parent.info.run_id)
    assert parent.info.status == "KILLED" and parent.info.end_time == point.info.end_time  # last seen at work
    stopped = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(point.info.end_time / 1000))
    assert (f"{parent.info.run_name} (run {parent.info.run_id}) was left running by a driver that is gone: "
            f"marked KILLED as of {stopped}") in status.stdout
    assert parent.data.tags["suite.error"].startswith(f"its driver (pid {driver.pid} on ")


@pytest.mark.slow
def test_a_point_the_full_disk_keeps_from_the_store_is_one_line_and_the_next_sweep_runs_it(results, store):
    # The disk fills at the store's size: the point runs, its run cannot be written, the sweep says so and goes on.
    store.experiment_id("adhoc")
    point = [*DIGITS, "epochs=1", "steps_per_epoch=2"]
    driver = [sys.executable, "-m", "suite", *point]
    limit = (results / "mlflow.db").stat().st_size
    cut = subprocess.run(driver, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                         preexec_fn=lambda: full_disk(limit))
    assert cut.returncode == 1, cut.stdout + cut.stderr[-3000:]
    (line,) = [line for line in cut.stdout.splitlines() if "] incomplete: " in line]
    assert "not recorded (MlflowException: " in line and "the next sweep runs it again" in line
    assert "1 of 1 point(s) did not finish: digits/resnet18/single/w1 (incomplete)" in cut.stderr
    assert store.finished_run("adhoc", plan([point])[0].config_hash) is None
    again = run_suite(*point)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert store.finished_run("adhoc", plan([point])[0].config_hash) is not None
