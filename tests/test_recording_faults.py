"""Faults that would lose or misreport a run: a recorder killed outright or stopped by a full disk, a sweep killed
outright. Each leaves a state that the next recorder, sweep or `make status` recognises and repairs.

A full disk without root: the recorder runs under RLIMIT_FSIZE, so that a write past the limit fails with EFBIG
(SIGXFSZ ignored), the same OSError path as ENOSPC on a full disk.
"""

import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from analysis.runs import latest_per_point
from conftest import DIGITS, copy_rank_outputs, run_suite
from suite.paths import REPO_ROOT
from suite.records.manifest import git_sha
from suite.records.owner import Owner
from suite.records.point_dir import PointDir
from suite.records.store import INCOMPLETE, run_status
from suite.sweep.driver import skip_reason
from suite.sweep.plan import Point, plan
from suite.sweep.point import new_point_dir
from suite.sweep.status import status_rows

DISK_FULL = "not recorded (OSError: [Errno 27] File too large"  # EFBIG; on a full disk: [Errno 28] No space left


def holder(out: PointDir) -> subprocess.Popen:
    """A recorder that claimed the point and then waits (until its stdin closes)."""
    code = ("import sys; from suite.records.point_dir import PointDir; "
            f"assert PointDir({str(out.path)!r}).claim(); print('claimed', flush=True); sys.stdin.read()")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "claimed\n"
    return process


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


def point_dir(worker_outputs) -> tuple[Point, PointDir]:
    """A planned point whose directory holds what a real rank left behind, to be recorded (in `results`)."""
    (point,) = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2"]])
    out = new_point_dir(point)
    copy_rank_outputs(worker_outputs, out.path)
    return point, out


def full_disk(file_size_limit: int) -> None:
    """In a child process before it starts: no file can grow past `file_size_limit` bytes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write that fails, not a process killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))


def record(out: PointDir, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """A batch job's last step, `python -m suite.records.record`, here on a disk that is full after
    `file_size_limit` bytes of any one file."""
    return subprocess.run([sys.executable, "-m", "suite.records.record", str(out.path), "--exit-code", "0",
                           "--started", str(time.time())], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          preexec_fn=None if file_size_limit is None else lambda: full_disk(file_size_limit))


@pytest.mark.slow
@pytest.mark.xdist_group("recording_faults")  # one worker runs these: the rank of worker_outputs runs once
def test_a_disk_full_at_the_claim_leaves_no_claim_and_the_rerun_records_the_point(results, store, worker_outputs):
    _, out = point_dir(worker_outputs)
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
    point, out = point_dir(worker_outputs)
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
    assert run.info.status == "RUNNING" and run.data.tags["suite.status"] == "finished"  # as the full disk left it
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
