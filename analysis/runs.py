"""Rows of the report: one per point, read from MLflow runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    run_id: str
    dataset: str
    network: str
    strategy: str
    workers: int
    status: str
    epoch_time_s: float | None
    throughput: float | None
    peak_memory_mb: float | None
    val_metric: str | None
    val_value: float | None
    start_time: int

    @property
    def workload(self) -> tuple[str, str]:
        return self.dataset, self.network


def row_from_run(run) -> Row:
    p, m, t = run.data.params, run.data.metrics, run.data.tags
    metric = "val_accuracy" if "val_accuracy" in m else "val_perplexity" if "val_perplexity" in m else None
    return Row(
        run_id=run.info.run_id, dataset=p.get("dataset", "?"), network=p.get("network", "?"),
        strategy=p.get("strategy", "?"), workers=int(p.get("workers", 0)), status=t.get("suite.status", "?"),
        epoch_time_s=m.get("epoch_time_s_mean"), throughput=m.get("throughput_samples_s_mean"),
        peak_memory_mb=m.get("peak_memory_mb"), val_metric=metric, val_value=m.get(metric) if metric else None,
        start_time=run.info.start_time,
    )


def latest_per_point(runs) -> list[Row]:
    """The newest finished run of each config hash, else its newest run: re-runs never hide results."""
    best: dict[str, Row] = {}
    for run in sorted(runs, key=lambda r: r.info.start_time):
        key = run.data.tags.get("suite.config_hash", run.info.run_id)
        row = row_from_run(run)
        if key not in best or row.status == "finished" or best[key].status != "finished":
            best[key] = row
    return sorted(best.values(), key=lambda r: (r.dataset, r.network, r.strategy != "single", r.strategy, r.workers))
