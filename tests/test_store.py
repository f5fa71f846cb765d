"""The store refuses a summary metric the shared vocabulary does not declare, before writing anything, so that a
metric cannot be silently dropped; the declared ones are recorded."""

import time

import pytest

from suite.records.store import Store
from suite.shared_names import Status


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'mlflow.db'}")


def record(store: Store, summary: dict) -> str:
    now = time.time()
    return store.record("vocabulary", "point", {"workers": 1}, {"suite.status": Status.finished}, [], summary, [],
                        now, now)


def test_an_undeclared_summary_metric_is_refused_and_nothing_is_written(store):
    with pytest.raises(ValueError, match=r"\['epoch_time_typo_s'\] are not declared in suite.shared_names"):
        record(store, {"epoch_time_typo_s": 1.0})
    experiment = store.client.get_experiment_by_name("vocabulary")
    assert experiment is None or not store.client.search_runs([experiment.experiment_id])


def test_a_declared_summary_metric_is_recorded(store):
    run = store.client.get_run(record(store, {"epoch_time_s_mean": 2.5}))
    assert run.data.metrics["epoch_time_s_mean"] == 2.5


def test_a_run_whose_params_were_edited_is_inconsistent_to_the_report_and_the_resume_alike(store):
    """Hostile inputs 3, case 4: a run's params changed by hand in the sqlite file (strategy=warpdrive) were reported
    as they read while a resumed sweep skipped the point by its unchanged config hash. Both now read the run as
    `inconsistent`: the report leaves it out of its results and the sweep runs the point again."""
    import sqlite3

    from analysis.runs import row_from_run
    from suite.records.run_schema import INCONSISTENT, run_status
    from suite.sweep.driver import skip_reason

    now = time.time()
    run_id = store.write_run("adhoc", "digits/resnet18/ddp/w2", {"strategy": "ddp", "workers": 2},
                             {"suite.status": Status.finished, "suite.config_hash": "0123456789abcdef"}, [], [], now,
                             now)
    (run,) = store.runs("adhoc")
    assert run_status(run) == Status.finished
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE params SET value = 'warpdrive' WHERE run_uuid = ? AND key = 'strategy'", (run_id,))
    (run,) = store.runs("adhoc")
    assert run.data.params["strategy"] == "warpdrive" and run_status(run) == INCONSISTENT
    assert skip_reason(run, "code", force=False, retry_failed=False) is None  # run again
    assert row_from_run(run).status == INCONSISTENT  # the report's row: not finished, so in no result


def schema_and_experiments(db) -> tuple[list, list, list]:
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as connection:
        # each table's definition as the set of its lines: MLflow's migrations order a table's constraints as a set
        # iterates, differently from one process to the next
        return ([(kind, name, sorted((sql or "").replace(",", "").splitlines())) for kind, name, sql in
                 connection.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")],
                connection.execute("SELECT * FROM alembic_version").fetchall(),
                connection.execute("SELECT experiment_id, name, artifact_location FROM experiments").fetchall())


def test_a_new_store_is_a_copy_of_the_environments_empty_one_as_mlflow_would_make_it(tmp_path, monkeypatch):
    """`make setup` keeps an empty store in the environment; a new store starts as a copy of it, not by MLflow's
    schema migrations (3 s of CPU at each of a sweep's first run, a test's, a job's sqlite store), and is then
    what MLflow makes: the same tables, schema version and Default experiment."""
    import mlflow.store.db.utils
    from mlflow.tracking import MlflowClient

    from suite.records.store_health import write_empty_store

    migrated = tmp_path / "migrated.db"
    MlflowClient(tracking_uri=f"sqlite:///{migrated}").search_experiments(max_results=1)
    write_empty_store()

    def no_migrations(engine):
        raise AssertionError("a new store ran MLflow's migrations")

    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", no_migrations)
    copied = tmp_path / "results" / "mlflow.db"
    Store(f"sqlite:///{copied}")
    assert schema_and_experiments(copied) == schema_and_experiments(migrated)
