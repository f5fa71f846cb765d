"""Which points a sweep runs again, from the runs a real MLflow store holds for them."""

import time

import pytest

from suite.records.store import Store
from suite.sweep.driver import skip_reason

pytestmark = pytest.mark.xdist_group("skip")  # one worker runs the module: its fixtures run once

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER_SHA = "fedcba9876543210fedcba9876543210fedcba98"
HASH = "c0ffee00c0ffee00"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module: creating one takes seconds, and each test reads only its own runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SUITE_RESULTS_DIR", str(tmp_path_factory.mktemp("results")))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield Store()


def recorded(store: Store, status: str, git_sha: str = SHA, config_hash: str = HASH, **tags: str):
    """A run of the point as the driver records it, read back from the store."""
    tags = {"suite.status": status, "suite.config_hash": config_hash, "suite.git_sha": git_sha, **tags}
    now = time.time()
    run_id = store.record("adhoc", "digits/resnet18/ddp/w2", {"workers": 2}, tags, [], {}, [], now, now)
    return store.client.get_run(run_id)


def test_a_point_never_run_runs():
    assert skip_reason(None, SHA, force=False, retry_failed=False) is None


def test_a_finished_run_with_this_config_is_skipped(store):
    run = recorded(store, "finished")
    assert skip_reason(run, SHA, force=False, retry_failed=False) == f"finished run {run.info.run_id} has this config"
    assert skip_reason(run, SHA, force=False, retry_failed=True) is not None  # retrying is for failures only


def test_a_finished_run_measured_with_other_code_is_skipped_with_a_note(store):
    run = recorded(store, "finished", git_sha=OTHER_SHA)
    assert skip_reason(run, SHA, force=False, retry_failed=False) == (
        f"finished run {run.info.run_id} has this config\n"
        "  (measured with code fedcba9876, now 0123456789: add --force / FORCE=1 to measure again)")


def test_force_runs_every_point_again(store):
    assert skip_reason(recorded(store, "finished"), SHA, force=True, retry_failed=False) is None
    assert skip_reason(recorded(store, "failed"), SHA, force=True, retry_failed=False) is None


def test_a_failed_run_is_retried_only_when_asked(store):
    run = recorded(store, "oom", **{"suite.error": "rank 1 was killed by SIGKILL"})
    assert skip_reason(run, SHA, force=False, retry_failed=False) == (
        f"its last run {run.info.run_id} ended oom: rank 1 was killed by SIGKILL "
        "(--retry-failed / RETRY_FAILED=1 runs it again)")
    assert skip_reason(run, SHA, force=False, retry_failed=True) is None


def test_a_run_cut_short_by_stopping_the_sweep_runs_again(store):
    run = recorded(store, "timeout", **{"suite.interrupted": "SIGTERM", "suite.error": "the sweep got SIGTERM"})
    assert skip_reason(run, SHA, force=False, retry_failed=False) is None


def test_a_finished_run_speaks_for_the_point_over_a_newer_failed_one(store):
    finished = recorded(store, "finished", config_hash="5ca1ab1e5ca1ab1e")
    failed = recorded(store, "failed", config_hash="5ca1ab1e5ca1ab1e", **{"suite.error": "rank 0 exited with code 3"})
    assert store.finished_run("adhoc", "5ca1ab1e5ca1ab1e").info.run_id == finished.info.run_id
    assert store.latest_run("adhoc", "5ca1ab1e5ca1ab1e").info.run_id == failed.info.run_id
    assert store.finished_run("adhoc", "another0hash0000") is None
