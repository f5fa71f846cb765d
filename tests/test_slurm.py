"""The batch path on a real one-node Slurm (`make slurm-local`): sbatch, srun's ranks, the job's own
recording, resume, `make status`, and jobs ended by the scheduler (scancel) recorded by `make collect`."""

import json
import re
import subprocess
import time

import pytest

from conftest import DIGITS, free_port, run_suite, tracking_server
from suite.paths import REPO_ROOT
from suite.point_dir import PointDir
from suite.records.store import Store
from suite.runtime.rendezvous import slurm_hosts
from suite.tools.slurm_local import SlurmUnavailable, ensure_running

# Slurm jobs, `make` and the driver; one xdist worker runs them, in turn on the one-node Slurm.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

QUICK = [*DIGITS, "epochs=1", "steps_per_epoch=2", "cluster=slurm-local", "strategy=single"]


@pytest.fixture(scope="session")
def slurm():
    """A running one-node Slurm, installed and started as `make slurm-local` does when it is not there."""
    try:
        ensure_running()
    except SlurmUnavailable as e:  # a missing Slurm is a failure: skipping would hide a missing feature
        pytest.fail(f"these tests need a real Slurm: {e}", pytrace=False)


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)


def wait_until(condition, what: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.5)


def jobs_ended(job_ids: list[str]) -> bool:
    """Neither pending, running nor completing (squeue lists only those by default)."""
    listed = subprocess.run(["squeue", "--noheader", f"--jobs={','.join(job_ids)}", "--format=%i"],
                            capture_output=True, text=True).stdout
    return not listed.split()


def submit(results, *overrides: str) -> tuple[str, PointDir]:
    result = run_suite(*QUICK, *overrides)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (job_id,) = re.findall(r"submitted: slurm job (\d+)", result.stdout)
    (path,) = (results / "points" / "adhoc").iterdir()
    return job_id, PointDir(path)


def test_sweep_runs_as_slurm_jobs_records_their_ids_and_resumes(slurm, results, store):
    first = make("sweep", "CLUSTER=slurm-local", "SWEEP=digits")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    job_ids = re.findall(r"submitted: slurm job (\d+)", first.stdout)
    assert len(job_ids) == 2 and "## digits" not in first.stdout  # returned at once, nothing to report yet
    wait_until(lambda: jobs_ended(job_ids), f"Slurm jobs {job_ids}")
    assert make("collect").returncode == 0  # the jobs judged their points; one process writes the sqlite store

    (parent,) = [r for r in store.runs("digits") if "suite.sweep" in r.data.tags]  # the sweep invocation's run
    runs = {r.info.run_name: r for r in store.runs("digits") if "suite.sweep" not in r.data.tags}
    assert sorted(runs) == ["digits/resnet18/ddp/w2", "digits/resnet18/single/w1"]
    assert {r.data.tags["mlflow.parentRunId"] for r in runs.values()} == {parent.info.run_id}
    for run in runs.values():
        tags = run.data.tags
        assert tags["suite.status"] == "finished", tags.get("suite.error")
        assert tags["suite.scheduler"] == "slurm" and tags["suite.job_id"] in job_ids
        manifest = json.loads((PointDir(tags["suite.point_dir"]).manifest_file).read_text())
        assert manifest["scheduler_job_id"] == tags["suite.job_id"]
    ddp = PointDir(runs["digits/resnet18/ddp/w2"].data.tags["suite.point_dir"])
    assert "rank 1 of 2 (local 1 of 2) from srun" in ddp.rank_log(1).read_text()  # ranks from Slurm's env
    artifacts = {a.path for a in store.client.list_artifacts(runs["digits/resnet18/ddp/w2"].info.run_id)}
    assert {"job.json", "manifest.json", "launcher.log", "logs"} <= artifacts
    assert any(a.endswith(".sh") for a in artifacts)

    again = make("sweep", "CLUSTER=slurm-local", "SWEEP=digits")
    assert again.returncode == 0 and "submitted" not in again.stdout
    assert again.stdout.count("skipped: finished run") == 2

    status = make("status", "CLUSTER=slurm-local", "SWEEP=digits")
    rows = [line.split() for line in status.stdout.splitlines() if line.startswith("digits/")]
    assert sorted((row[1], row[3], row[4]) for row in rows) == sorted(("finished", "slurm", i) for i in job_ids)
    assert "2 point(s): 2 finished" in status.stdout


def test_cancelled_job_is_recorded_by_collect_with_the_schedulers_verdict(slurm, results, store):
    job_id, out = submit(results, "fault.kind=hang")
    wait_until(lambda: out.rank_log(0).exists() and "rank 0 of 1" in out.rank_log(0).read_text(), "the rank")
    time.sleep(2)
    subprocess.run(["scancel", job_id], check=True)
    wait_until(lambda: jobs_ended([job_id]), f"Slurm job {job_id}")
    assert store.runs("adhoc") == []  # the job was being ended by Slurm: it leaves the verdict to Slurm

    collected = make("collect")
    assert collected.returncode == 0, collected.stderr[-2000:]
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "failed"
    assert run.data.tags["suite.error"] == f"slurm job {job_id} ended CANCELLED after 0 of 1 epochs"
    assert make("collect").returncode == 0 and len(store.runs("adhoc")) == 1  # recorded once


def test_sigterm_to_the_ranks_records_timeout_with_the_epochs_completed(slurm, results, store):
    # Hangs in epoch 2 (step 4: one warm-up step, then two steps per epoch) after epoch 1 was saved.
    job_id, out = submit(results, "epochs=2", "fault.kind=hang", "fault.step=4")
    wait_until(lambda: len(out.epochs()) == 1, "the first epoch")
    subprocess.run(["scancel", "--signal=TERM", job_id], check=True)  # SIGTERM to the ranks alone (not the script)
    wait_until(lambda: jobs_ended([job_id]), f"Slurm job {job_id}")
    assert make("collect").returncode == 0

    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "timeout"
    assert run.data.tags["suite.error"] == ("rank 0: Stopped: stopped by SIGTERM (a time limit, a preemption or "
                                            "a cancel) after 1 of 2 epochs")
    assert [m.step for m in store.client.get_metric_history(run.info.run_id, "epoch_time_s")] == [1]


def test_job_that_cannot_reach_the_tracking_server_is_recorded_later_by_collect(slurm, results):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tracking_server(port):  # up while the sweep submits (the job is held), down once the job runs
        job_id, out = submit(results, f"cluster.tracking_uri={url}", "cluster.job.directives=[--hold]")
    subprocess.run(["scontrol", "release", job_id], check=True)
    wait_until(lambda: jobs_ended([job_id]), f"Slurm job {job_id}")
    assert out.summary() is not None and out.recorded() is None  # the results wait on the shared file system
    job_output = (results / "jobs" / "adhoc" / f"{out.path.name}.out").read_text()
    assert "not recorded" in job_output and "make collect" in job_output

    with tracking_server(port):
        collected = make("collect")
        assert collected.returncode == 0, collected.stderr[-2000:]
        (run,) = Store(url).runs("adhoc")
        assert run.data.tags["suite.status"] == "finished" and run.data.tags["suite.job_id"] == job_id
        assert make("collect").returncode == 0 and len(Store(url).runs("adhoc")) == 1  # imported once


def test_a_job_slurm_refuses_is_recorded_as_failed(slurm, results, store):
    result = run_suite(*QUICK, "cluster.job.queue=nosuchpartition")
    assert result.returncode == 1 and "not submitted" in result.stdout
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "failed"
    assert run.data.tags["suite.error"].startswith("submission: SchedulerError: sbatch --parsable failed: "
                                                   "sbatch: error: invalid partition")


def test_horovod_point_runs_as_a_slurm_job_under_horovodrun(slurm, results, store):
    """The job script starts horovodrun on the job's node with -H from SLURM_JOB_NODELIST (no srun)."""
    job_id, out = submit(results, "strategy=horovod", "workers=2")
    wait_until(lambda: jobs_ended([job_id]), f"Slurm job {job_id}")
    assert make("collect").returncode == 0
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "finished", run.data.tags.get("suite.error")
    assert "rank 1 of 2 (local 1 of 2) from horovodrun" in out.rank_log(1).read_text()


def test_axonn_pipeline_runs_as_a_slurm_job_under_mpiexec(slurm, results, store):
    """AxoNN's 2 stages, MPI ranks: the job script starts MPICH's mpiexec, which reads the Slurm allocation and starts
    its proxy with srun; the ranks find their places in its variables and send activations over MPI."""
    job_id, out = submit(results, "strategy=axonn", "workers=2", "strategy.pp=2", "strategy.micro_batches=4")
    wait_until(lambda: jobs_ended([job_id]), f"Slurm job {job_id}")
    assert make("collect").returncode == 0
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "finished", run.data.tags.get("suite.error")
    assert "rank 1 of 2 (local 1 of 2) from mpiexec/Hydra" in out.rank_log(1).read_text()


def test_slurms_warning_to_the_batch_shell_stops_the_point_and_it_is_recorded_as_timeout(slurm, results, store):
    """What `--signal=B:USR1@<margin>` sends before the time limit, sent now: the script stops the running ranks
    (SIGUSR2 to srun, which hands it on), they keep the epoch they completed, and the point is `timeout`, not
    cancelled or killed."""
    job_id, out = submit(results, "epochs=2", "fault.kind=hang", "fault.step=4")
    wait_until(lambda: len(out.epochs()) == 1, "the first epoch")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    wait_until(lambda: jobs_ended([job_id]), f"Slurm job {job_id}")
    job_output = (results / "jobs" / "adhoc" / f"{out.path.name}.out").read_text()
    assert "suite: the time limit is near: stopping" in job_output
    assert make("collect").returncode == 0  # records what the job's last step judged, if the job did not
    (run,) = store.runs("adhoc")
    assert run.data.tags["suite.status"] == "timeout"
    assert run.data.tags["suite.error"] == ("rank 0: Stopped: stopped by SIGUSR2 (a time limit, a preemption or "
                                            "a cancel) after 1 of 2 epochs")


def test_node_lists_are_read_as_slurm_reads_them(slurm):
    for nodelist in ("rack[1-2]-node[01-02]", "gpu[07-09,12],login1", "n[98-101]", "n[1-2,5]x[1-2],m3", "tux[0-3]"):
        expanded = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        assert slurm_hosts(nodelist) == expanded.stdout.split()
