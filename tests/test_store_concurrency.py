"""Eight points recorded at the same moment lose none: eight jobs' last steps leave them to one `make collect` (the
default with a sqlite store), eight processes write them into the sqlite store (`cluster.job.record_in_job=true`)
or through the tracking server of `make mlflow-server`. Eight processes on this machine's disk: whether a network
file system's locks hold as well is not tested here."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DIGITS, copy_rank_outputs, free_port, tracking_server
from suite.paths import REPO_ROOT
from suite.point_dir import PointDir
from suite.records.store import Store
from suite.sweep import jobs
from suite.sweep.plan import new_point_dir, plan

# A real rank (conftest's worker_outputs), eight recorders and `make mlflow-server`; one xdist worker runs the
# module (its fixture runs once).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("store_concurrency")]

POINTS = 8


def record_concurrently(worker_outputs: Path, tracking_uri: str, *overrides: str) -> list[PointDir]:
    """Eight jobs' last steps at once (`python -m suite.records.record`), each for a point of its own."""
    points = plan([[*DIGITS, "epochs=1", "steps_per_epoch=2", f"seed={seed}", "tracking.experiment=concurrent",
                    *overrides] for seed in range(POINTS)])
    Store(tracking_uri).experiment_id("concurrent")  # as the submitting driver does, before the jobs start
    dirs = []
    for seed, point in enumerate(points):
        out = new_point_dir(point)
        copy_rank_outputs(worker_outputs, out.path)
        out.write_job({"scheduler": "slurm", "job_id": str(seed), "submitted": time.time()})
        dirs.append(out)
    env = dict(os.environ, MLFLOW_TRACKING_URI=tracking_uri)
    recorders = [subprocess.Popen([sys.executable, "-m", "suite.records.record", str(out.path), "--exit-code", "0",
                                   "--started", str(time.time())], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for out in dirs]
    for recorder in recorders:
        output = recorder.communicate(timeout=300)[0]
        assert recorder.returncode == 0, output[-2000:]
    return dirs


def assert_all_recorded(store: Store, dirs: list[PointDir]) -> None:
    runs = store.runs("concurrent")
    assert sorted(r.data.tags["suite.point_dir"] for r in runs) == sorted(str(d.path) for d in dirs)
    for run in runs:
        assert run.data.tags["suite.status"] == "finished" and "epoch_time_s_mean" in run.data.metrics
        assert {a.path for a in store.client.list_artifacts(run.info.run_id, "logs")} == {"logs/rank0.log"}
    assert all(d.recorded()["run_id"] in {r.info.run_id for r in runs} for d in dirs)


def test_eight_jobs_leave_a_sqlite_store_to_one_collect_which_records_all(results, worker_outputs):
    dirs = record_concurrently(worker_outputs, f"sqlite:///{results / 'mlflow.db'}")
    assert Store().runs("concurrent") == [] and all(d.ended() and not d.recorded() for d in dirs)
    assert jobs.collect() == []
    assert_all_recorded(Store(), dirs)


def test_eight_points_recorded_at_once_into_sqlite(results, worker_outputs):
    dirs = record_concurrently(worker_outputs, f"sqlite:///{results / 'mlflow.db'}", "cluster.job.record_in_job=true")
    assert_all_recorded(Store(), dirs)


def test_eight_points_recorded_at_once_through_make_mlflow_server(results, worker_outputs):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tracking_server(port):
        dirs = record_concurrently(worker_outputs, url)
        assert_all_recorded(Store(url), dirs)
    assert len(Store().runs("concurrent")) == POINTS  # the server wrote them into the suite's sqlite store
    assert list((results / "artifacts").rglob("rank0.log"))  # and their artifacts under results/
