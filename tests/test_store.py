"""The store refuses a summary metric the shared vocabulary does not declare, before writing anything, so that a
metric cannot be silently dropped; the declared ones are recorded."""

import time

import pytest

from suite.records.store import Store
from suite.vocabulary import Status


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'mlflow.db'}")


def record(store: Store, summary: dict) -> str:
    now = time.time()
    return store.record("vocabulary", "point", {"workers": 1}, {"suite.status": Status.finished}, [], summary, [],
                        now, now)


def test_an_undeclared_summary_metric_is_refused_and_nothing_is_written(store):
    with pytest.raises(ValueError, match=r"\['epoch_time_typo_s'\] are not declared in suite.vocabulary"):
        record(store, {"epoch_time_typo_s": 1.0})
    experiment = store.client.get_experiment_by_name("vocabulary")
    assert experiment is None or not store.client.search_runs([experiment.experiment_id])


def test_a_declared_summary_metric_is_recorded(store):
    run = store.client.get_run(record(store, {"epoch_time_s_mean": 2.5}))
    assert run.data.metrics["epoch_time_s_mean"] == 2.5
