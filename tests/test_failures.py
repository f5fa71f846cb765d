"""Broken points are recorded with their status and one readable error line; the sweep goes on."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import DIGITS, run_suite
from suite.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # the driver `python -m suite` launches every point

FAST = [*DIGITS, "epochs=1"]


def processes_using(path: Path) -> list[int]:
    """Processes with a file under `path` open: a rank keeps its log open until it ends."""
    found = []
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd).startswith(f"{path}/") for fd in fds.iterdir()):
                found.append(int(fds.parent.name))
        except OSError:  # it ended meanwhile
            pass
    return found


def statuses(store):
    return {r.info.run_name: r for r in store.runs("adhoc")}


def test_failing_points_are_recorded_and_the_sweep_goes_on(store):
    # One sweep: an exception in rank 1, a real allocator failure, rank 1 SIGKILLed as by the kernel's
    # out-of-memory killer (rank 0 then fails too, as a consequence), then a healthy point.
    result = run_suite("-m", *FAST, "strategy=ddp", "workers=2", "fault.rank=1", "fault.kind=error,oom,kill,null")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "3 of 4 point(s) did not finish" in result.stderr
    runs = sorted(store.runs("adhoc"), key=lambda r: r.info.start_time)
    assert [r.data.tags["suite.status"] for r in runs] == ["failed", "oom", "oom", "finished"]
    failed, oom, killed, finished = runs
    assert failed.data.tags["suite.error"] == "rank 1: RuntimeError: injected fault at step 1"
    assert "can't allocate memory" in oom.data.tags["suite.error"]
    assert killed.data.tags["suite.error"].startswith("rank 1 was killed by SIGKILL")
    assert "suite.error" not in finished.data.tags
    assert failed.info.status == "FAILED" and finished.info.status == "FINISHED"
    logs = {a.path for a in store.client.list_artifacts(failed.info.run_id, "logs")}
    assert logs == {"logs/rank0.log", "logs/rank1.log"}


def test_a_cpu_rank_held_to_its_memory_runs_out_of_it(store):
    # ResNet-18's DDP ranks peak near 0.8 GB here: held to 0.6 GB, an allocation fails as on a full GPU.
    result = run_suite("-m", *FAST, "strategy=ddp", "workers=2", "cluster.hardware.device_memory_gb=0.6,2")
    assert result.returncode == 1, result.stderr[-3000:]
    runs = {r.data.params["cluster.hardware.device_memory_gb"]: r for r in store.runs("adhoc")}
    assert runs["0.6"].data.tags["suite.status"] == "oom"
    assert "can't allocate memory" in runs["0.6"].data.tags["suite.error"]
    assert runs["2.0"].data.tags["suite.status"] == "finished"
    assert 600 < runs["2.0"].data.metrics["peak_memory_mb"] < 2048


def test_hung_point_ends_as_timeout(store):
    result = run_suite(*FAST, "strategy=single", "fault.kind=hang", "timeout_s=25")
    assert result.returncode == 1
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "timeout"
    assert "timeout_s=25" in run.data.tags["suite.error"]


def test_worker_dying_without_traceback_is_retried_only_when_asked(store):
    args = [*FAST, "strategy=single", "fault.kind=exit"]
    result = run_suite(*args)
    assert result.returncode == 1
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "failed"
    assert run.data.tags["suite.error"] == "rank 0 exited with code 3 without an error report (see its log)"

    again = run_suite(*args, "--dry-run")
    assert f"skipped: its last run {run.info.run_id} ended failed" in again.stdout
    assert "would run here" in run_suite(*args, "--dry-run", "--retry-failed").stdout


def test_real_data_smaller_than_the_steps_asked_for_is_recorded_invalid(store, tmp_path):
    # The size of real data is only known once a worker reads it, so this is caught after launch.
    for split in ("train", "val"):
        np.arange(16 * 20 + 1, dtype=np.uint16).tofile(tmp_path / f"{split}.bin")
    result = run_suite("dataset=wikitext103", f"dataset.path={tmp_path}", "dataset.seq_len=16", "network=gpt2_tiny",
                       "batch_size=4", "epochs=1", "steps_per_epoch=6")
    assert result.returncode == 1
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "invalid"
    assert "steps_per_epoch=6 but the shard holds 5 batches of 4" in run.data.tags["suite.error"]


def test_stopping_the_driver_stops_the_ranks_and_records_the_point_as_timeout_killed(store, results):
    cmd = [sys.executable, "-m", "suite", *FAST, "strategy=ddp", "workers=2", "fault.kind=hang"]
    driver = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list(results.glob("points/adhoc/*/logs/rank1.log")) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # the ranks are training (rank 0 hangs at step 1)
    point_dir = next(results.glob("points/adhoc/*"))
    driver.send_signal(signal.SIGTERM)  # what a scheduler sends before killing a job
    assert driver.wait(60) == 130, driver.stdout.read()[-3000:]
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "timeout" and run.info.status == "KILLED"  # MLflow's word for stopped
    assert run.data.tags["suite.error"] == "the sweep got SIGTERM (a time limit or a preemption) after 0 of 1 epochs"
    assert processes_using(point_dir) == []  # no orphaned ranks keep the cores busy
    resumed = run_suite(*cmd[3:], "--dry-run")  # the same sweep again runs the point it was stopped in
    assert "would run here" in resumed.stdout, resumed.stdout


def test_horovod_point_killed_or_hung_is_recorded_and_leaves_no_ranks(store, results):
    # horovodrun reports `Process 1 exit with status code 137`, then freezes and SIGKILLs the other ranks:
    # the rank that died first is the cause. Its ranks run in sessions of their own; the timeout stops them too.
    # The killed point's time limit leaves room for horovodrun's start on a loaded machine (3 test workers on 2
    # cores took over 20 s), so that it ends by the kill; the hung one ends by its limit either way.
    for kind, limit in (("kill", 180), ("hang", 20)):
        result = run_suite(*FAST, "strategy=horovod", "workers=2", "fault.rank=1", f"fault.kind={kind}",
                           f"timeout_s={limit}")
        assert result.returncode == 1, result.stderr[-3000:]
    killed, hung = sorted(store.runs("adhoc"), key=lambda r: r.info.start_time)
    assert killed.data.tags["suite.status"] == "oom"
    assert killed.data.tags["suite.error"].startswith("rank 1 was killed by SIGKILL")
    assert hung.data.tags["suite.status"] == "timeout"
    leftover = subprocess.run(["pgrep", "-f", str(results / "points")], capture_output=True, text=True).stdout
    assert leftover == ""


def test_a_diverged_point_is_recorded_diverged_with_its_step_and_value(store):
    """A loss that becomes non-finite ends the point at once: `diverged`, the step and the value in its error line,
    no epoch time or speedup reported, and the sweep's exit says it did not finish. lr=1e30 overflows GPT-2's
    weights on the first update, so the second warm-up step's loss is nan; lr=1 trains."""
    result = run_suite("-m", "dataset=tokens", "network=gpt2_nano", "dataset.seq_len=16", "dataset.samples=64",
                       "dataset.val_samples=16", "batch_size=16", "epochs=2", "warmup_steps=2",
                       "optimizer.lr=1e30,1")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "1 of 2 point(s) did not finish" in result.stderr
    runs = {r.data.params["optimizer.lr"]: r for r in store.runs("adhoc")}
    diverged = runs["1e+30"].data
    assert diverged.tags["suite.status"] == "diverged" and runs["1.0"].data.tags["suite.status"] == "finished"
    assert diverged.tags["suite.error"] == ("rank 0: Diverged: loss nan at warm-up step 2: training diverged "
                                            "(optimizer.lr=1e+30)")
    assert "epoch_time_s_mean" not in diverged.metrics
