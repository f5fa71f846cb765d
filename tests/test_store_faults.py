"""The store's faults answered in one line before anything runs, or survived: a report of an unknown sweep, a store
under a regular file, a tracking server that does not answer, a damaged sqlite file, two sweeps creating one store."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DIGITS, free_port, run_make, run_suite
from suite.paths import REPO_ROOT
from suite.records.store import Store
from suite.records.store_health import SERVER_TIMEOUT_S, StoreError

TINY = [*DIGITS, "epochs=1", "steps_per_epoch=1"]


def error_lines(stderr: str) -> list[str]:
    """What the command said, less make's own `make: *** ... Error 2`."""
    return [line for line in stderr.splitlines() if not line.startswith("make: ***")]


def store_with_a_run(db: Path) -> str:
    """A real sqlite store holding one finished run; its id."""
    store = Store(f"sqlite:///{db}")
    run = store.client.create_run(store.experiment_id("adhoc"), run_name="kept")
    store.client.log_metric(run.info.run_id, "epoch_time_s", 1.5)
    store.client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


def damage(db: Path) -> bytes:
    """Cut the file to half its size, as a full disk or a killed copy leaves it; what is left."""
    os.truncate(db, db.stat().st_size // 2)
    return db.read_bytes()


def test_a_store_opened_to_read_creates_nothing(tmp_path):
    db = tmp_path / "results" / "mlflow.db"
    store = Store(f"sqlite:///{db}", create=False)
    assert store.runs("adhoc") == [] and store.experiment_names() == []
    assert not db.parent.exists()


@pytest.mark.slow
def test_make_report_of_an_unknown_sweep_names_the_known_ones_and_creates_nothing(results):
    made = run_make("report", "SWEEP=does_not_exist")
    (line,) = error_lines(made.stderr)
    assert made.returncode != 0 and line.startswith("error: no sweep 'does_not_exist'")
    assert "known" in line and "smoke" in line and "study_j" in line
    assert not results.exists()


def test_a_report_of_an_experiment_without_runs_says_where_the_runs_are_and_writes_nothing(results, store):
    """Issue 59: `make report` (SWEEP=smoke) after points run by hand printed "(no runs)", exited 0, wrote 2 files."""
    store.client.create_run(store.experiment_id("adhoc"))
    made = run_suite("report", "smoke")
    assert made.returncode == 2 and error_lines(made.stderr) == [
        f"error: no runs of smoke recorded in {store.uri}: points run without a sweep (`suite run ...`) are recorded "
        "under adhoc; experiments with runs: adhoc (`make report SWEEP=<name>`)"]
    assert not (results / "reports").exists()


@pytest.mark.slow
def test_a_store_under_a_regular_file_is_one_line_before_launch(results, tmp_path):
    regular = tmp_path / "notes.txt"
    regular.write_text("not a directory")
    uri = f"sqlite:///{regular}/runs/mlflow.db"
    ran = run_suite(*TINY, f"tracking.uri={uri}")
    assert ran.returncode == 2
    assert ran.stderr.splitlines() == [f"error: cannot create the store {uri}: {regular} is a file, not a directory"]
    assert not results.exists() and regular.read_text() == "not a directory"  # nothing launched, nothing made


def test_a_tracking_server_that_does_not_answer_is_one_line_within_its_timeout():
    with socket.create_server(("127.0.0.1", 0)) as listener:  # takes connections, never answers
        uri = f"http://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"^the tracking server {uri} does not answer \\(timed out\\)"):
            Store(uri)
    assert time.monotonic() - started < SERVER_TIMEOUT_S + 3


@pytest.mark.slow
def test_an_unreachable_tracking_server_is_one_line_before_launch(results):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there: refused at once (MLflow retried for minutes)
    ran = run_suite(*TINY, f"tracking.uri={uri}")
    assert ran.returncode == 2
    (line,) = ran.stderr.splitlines()
    assert line.startswith(f"error: the tracking server {uri} does not answer") and "make mlflow-server" in line
    assert not (results / "points").exists()


def test_a_damaged_store_is_named_with_its_backup_and_restored_from_it(tmp_path):
    db = tmp_path / "mlflow.db"
    run_id = store_with_a_run(db)
    backup = Store(f"sqlite:///{db}").back_up()
    left = damage(db)
    with pytest.raises(StoreError) as refused:
        Store(f"sqlite:///{db}")
    line = str(refused.value)
    assert line.startswith(f"the store {db} is damaged (database disk image is malformed); nothing was written to it")
    assert db.read_bytes() == left
    restore = line.split(": ")[-1]
    assert restore == f"mv {db} {db}.damaged && cp {backup} {db}"
    subprocess.run(restore, shell=True, check=True)
    # The same file by a path this process's MLflow has not opened yet (it keeps connections to the damaged one).
    (run,) = Store(f"sqlite:///{db.parent}/./{db.name}").runs("adhoc")
    assert run.info.run_id == run_id and run.data.metrics == {"epoch_time_s": 1.5}


def test_a_damaged_store_without_a_backup_is_named_with_sqlite_recover(tmp_path):
    db = tmp_path / "mlflow.db"
    store_with_a_run(db)
    damage(db)
    with pytest.raises(StoreError, match=f"Salvage what is left: sqlite3 {db} .recover | sqlite3 "):
        Store(f"sqlite:///{db}", create=False)


@pytest.mark.slow
def test_the_driver_refuses_a_damaged_store_and_writes_nothing(results):
    db = results / "mlflow.db"
    store_with_a_run(db)
    left = damage(db)
    ran = run_suite(*TINY)
    assert ran.returncode == 2
    (line,) = ran.stderr.splitlines()
    assert line.startswith(f"error: the store {db} is damaged") and ".recover" in line
    assert db.read_bytes() == left and not (results / "points").exists()


@pytest.mark.slow
def test_two_sweeps_started_at_once_create_one_store_and_record_both(results):
    drivers = [subprocess.Popen([sys.executable, "-m", "suite", *TINY, f"seed={seed}"], cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for seed in (1, 2)]
    for driver in drivers:
        output = driver.communicate(timeout=600)[0]
        assert driver.returncode == 0, output[-3000:]
    runs = Store().runs("adhoc")
    assert sorted(run.data.params["seed"] for run in runs) == ["1", "2"]
    assert all(run.data.tags["suite.status"] == "finished" for run in runs)
    assert (results / "mlflow.db.bak").exists()  # each sweep's copy of the store, taken before it wrote


@pytest.fixture
def read_only_directory(tmp_path):
    """A directory on a read-only mount (a bind mount of an empty one): root writes through permissions, not this."""
    source, mounted = tmp_path / "source", tmp_path / "results"
    source.mkdir()
    mounted.mkdir()
    if subprocess.run(["mount", "--bind", str(source), str(mounted)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind is not permitted here (it needs root): no read-only file system to test on")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], check=True, capture_output=True)
        yield mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


@pytest.mark.slow  # mounts
def test_a_read_only_results_directory_is_one_line_before_launch(read_only_directory, monkeypatch, capsys):
    """Hostile inputs 3, case 3: EROFS on the store's lock file was a traceback."""
    from suite import __main__ as driver

    monkeypatch.setenv("SUITE_RESULTS_DIR", str(read_only_directory))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert driver.main([*DIGITS, "epochs=1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: cannot write in the results directory {read_only_directory} (Read-only file system): the store and "
        "every point's files go there; make it writable or set SUITE_RESULTS_DIR"]


def test_creating_the_store_prints_nothing_of_mlflows(results, capfd):
    """Hostile inputs 3, case 8: MLflow's two INFO lines on every store it created stood around the suite's lines."""
    Store()
    assert (results / "mlflow.db").exists()
    assert "mlflow" not in capfd.readouterr().err
