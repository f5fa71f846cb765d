"""Rows of the report: one per point, read from MLflow runs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from suite.records.run_schema import run_status
from suite.shared_names import AUTO, AUTO_CHOOSES, MEMORY_SPLIT, Status

# Metrics shown beside the memory split when a strategy reports them (max over ranks, per step).
SPLIT_METRICS = (*MEMORY_SPLIT, "comm_mb_per_step")
# Settings besides the strategy's own knobs that tell two runs of one strategy apart in a report.
VARIANT_PARAMS = ("precision", "optimizer.name", "activation_checkpointing", "cluster.hardware.device_memory_gb")


@dataclass(frozen=True)
class GridPoint:
    """A point's place in a sweep's grid."""

    dataset: str
    network: str
    strategy: str
    workers: int


@dataclass(frozen=True)
class Row(GridPoint):
    run_id: str
    status: str
    epoch_time_s: float | None
    throughput: float | None
    peak_memory_mb: float | None
    val_metric: str | None
    val_value: float | None
    start_time: int
    settings: dict[str, str] = field(default_factory=dict)  # the strategy's knobs and VARIANT_PARAMS
    split: dict[str, float] = field(default_factory=dict)  # the SPLIT_METRICS the run has
    label: str = ""  # the strategy plus the settings that differ between its rows (see `label_variants`)
    repeat: int = 0  # index of a repeated measurement (a sweep's `repeats`)
    config_hash: str = ""
    error: str | None = None  # suite.error: why it did not finish
    params: dict[str, str] = field(default_factory=dict)  # every param of the run
    metrics: dict[str, float] = field(default_factory=dict)  # every summary metric of the run

    @property
    def workload(self) -> tuple[str, str]:
        return self.dataset, self.network


def row_from_run(run) -> Row:
    p, m, t = run.data.params, run.data.metrics, run.data.tags
    metric = "val_accuracy" if "val_accuracy" in m else "val_perplexity" if "val_perplexity" in m else None
    settings = {k.removeprefix("strategy."): v for k, v in p.items()
                if (k.startswith("strategy.") and k not in ("strategy._target_", "strategy.name"))
                or k in VARIANT_PARAMS}
    if settings.get("pp") == AUTO:  # the planner's choice: not the point's identity
        for key in AUTO_CHOOSES:
            settings.pop(key.removeprefix("strategy."), None)
    return Row(
        run_id=run.info.run_id, dataset=p.get("dataset", "?"), network=p.get("network", "?"),
        strategy=p.get("strategy", "?"), workers=int(p.get("workers", 0)), status=run_status(run),
        epoch_time_s=m.get("epoch_time_s_mean"), throughput=m.get("throughput_samples_s_mean"),
        peak_memory_mb=m.get("peak_memory_mb"), val_metric=metric, val_value=m.get(metric) if metric else None,
        start_time=run.info.start_time, settings=settings, split={k: m[k] for k in SPLIT_METRICS if k in m},
        label=p.get("strategy", "?"), repeat=int(p.get("repeat", 0)), config_hash=t.get("suite.config_hash", ""),
        error=t.get("suite.error"), params=dict(p), metrics=dict(m),
    )


def label_variants(rows: list[Row]) -> list[Row]:
    """Name each row by its strategy and the settings in which that strategy's rows of the same workload
    differ, e.g. `zero zero_stage=3`, so that the points of one strategy stay apart in tables and plots."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.workload, row.strategy].append(row)
    labelled = []
    for row in rows:
        same = groups[row.workload, row.strategy]
        # A knob left unset (None) does not name a row; one a row does not record (the planner's choice, where
        # strategy.pp=auto) does not set it apart.
        differ = sorted((k for k, v in row.settings.items() if v != "None"
                         and len({r.settings[k] for r in same if k in r.settings}) > 1),
                        key=lambda k: (k in VARIANT_PARAMS, k))  # the strategy's own knobs first
        label = " ".join([row.strategy, *(f"{k}={row.settings[k]}" for k in differ)])
        labelled.append(replace(row, label=label))
    return labelled


def point_runs(runs) -> list:
    """The runs of points, without the parent runs of sweep invocations."""
    return [run for run in runs if "suite.sweep" not in run.data.tags]


def latest_per_point(runs) -> list[Row]:
    """The newest finished run of each config hash, else its newest run: re-runs never hide results."""
    best: dict[str, Row] = {}
    for run in sorted(point_runs(runs), key=lambda r: r.info.start_time):
        key = run.data.tags.get("suite.config_hash", run.info.run_id)
        row = row_from_run(run)
        if key not in best or row.status == Status.finished or best[key].status != Status.finished:
            best[key] = row
    rows = label_variants(list(best.values()))
    return sorted(rows, key=lambda r: (r.dataset, r.network, r.strategy != "single", r.label, r.workers))


def write_runs_csv(runs, path: Path) -> Path:
    """Every run as the store holds it, one line each (re-runs, failed points and the sweep invocations' runs
    included): ids, the suite's status and MLflow's, times (ms since the epoch), then `param.<name>` and
    `metric.<name>` (the last value of each) columns; empty where a run lacks one."""
    records = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags = run.data.tags
        records.append({
            "run_id": run.info.run_id, "run_name": run.info.run_name,
            "kind": "sweep" if "suite.sweep" in tags else "point", "status": run_status(run),
            "mlflow_status": run.info.status, "start_time": run.info.start_time, "end_time": run.info.end_time,
            "parent_run_id": tags.get("mlflow.parentRunId"), "config_hash": tags.get("suite.config_hash"),
            "git_commit": tags.get("mlflow.source.git.commit"), "error": tags.get("suite.error"),
            **{f"param.{k}": v for k, v in sorted(run.data.params.items())},
            **{f"metric.{k}": v for k, v in sorted(run.data.metrics.items())}})
    pd.DataFrame.from_records(records).to_csv(path, index=False)
    return path
