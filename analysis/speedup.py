"""Speedup table: each point's epoch time and throughput, its repeats aggregated, against its workload's baseline.

A point is a cell of the grid (dataset, network, strategy variant `Row.label`, workers); its repeats are aggregated
once, as analysis.measure does in every view. The baseline of a (dataset, network) is its `single` point on one
worker, else the point with the fewest workers of the same variant; a speedup is the point's throughput (samples/s)
over the baseline point's, which equals the epoch-time ratio when epochs cover the same data (one pass over the
training set).
"""

from __future__ import annotations

import statistics

from analysis.measure import Histories, cells, epoch_time, finished, speedup, status_of, throughput_estimate
from analysis.runs import SPLIT_METRICS, Row
from analysis.stats import Estimate, estimate
from analysis.tables import Table, interval_cell

SPLIT_HEADERS = {"mem_params_mb": "params MB", "mem_grads_mb": "grads MB", "mem_optim_mb": "optim MB",
                 "mem_master_mb": "master MB", "comm_mb_per_step": "comm MB/step"}


def measured(repeats: list[Row]) -> list[Row]:
    return [r for r in finished(repeats) if r.throughput]


def baseline_of(key: tuple, grouped: dict[tuple, list[Row]]) -> tuple | None:
    """The baseline point (its cell key) of the point `key`; None where nothing of its kind finished."""
    candidates = sorted(k for k, repeats in grouped.items() if k[:2] == key[:2] and measured(repeats))
    single = [k for k in candidates if grouped[k][0].strategy == "single" and k[3] == 1]
    if single:
        return single[0]
    same = sorted((k for k in candidates if k[2] == key[2]), key=lambda k: k[3])
    return same[0] if same else None


def throughput(repeats: list[Row]) -> float | None:
    """A point's throughput, its repeats aggregated (analysis.stats' value over their run means)."""
    values = [r.throughput for r in measured(repeats)]
    return estimate(values).value if values else None


def point_speedups(rows: list[Row]) -> dict[str, float]:
    """Each finished run's throughput over its baseline point's (repeats aggregated), by run id: the `speedup` metric
    a sweep gives its points' runs."""
    grouped, out = cells(rows), {}
    for key, repeats in grouped.items():
        base = baseline_of(key, grouped)
        if base is not None:
            rate = throughput(grouped[base])
            for row in measured(repeats):
                out[row.run_id] = row.throughput / rate
    return out


def cell_speedups(rows: list[Row], histories: Histories, protocol: str) -> dict[tuple, Estimate]:
    """Each point's speedup over its baseline point, with its interval, by cell key (the table's, and the figure's)."""
    grouped = cells(rows)
    out = {}
    for key, repeats in grouped.items():
        base = baseline_of(key, grouped)
        if base == key:  # exactly 1, no interval
            out[key] = Estimate(1.0, 1.0, 1.0, None, 1)
        elif base is not None and measured(repeats):
            found = speedup(repeats, grouped[base], histories, protocol)
            if found is not None:
                out[key] = found
    return out


def best_speedup(rows: list[Row], speedups: dict[str, float]) -> tuple[Row, float] | None:
    """The run of the largest speedup, and that speedup (None where no run has one)."""
    scored = [(speedups[r.run_id], r) for r in rows if r.run_id in speedups]
    if not scored:
        return None
    value, row = max(scored, key=lambda pair: pair[0])
    return row, value


def _median(repeats: list[Row], value) -> float | None:
    values = [v for v in (value(r) for r in finished(repeats)) if v is not None]
    return statistics.median(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def speedup_table(rows: list[Row], histories: Histories, protocol: str, title: str) -> Table:
    """One line per point; the memory split and communication columns appear when some point has them (per rank,
    the largest over ranks; the median over repeats, as are peak memory and the final validation metric)."""
    split = [k for k in SPLIT_METRICS if any(k in r.split for r in rows)]
    grouped = cells(rows)
    speedups = cell_speedups(rows, histories, protocol)
    lines = []
    for key in sorted(grouped, key=lambda k: (k[0], k[1], grouped[k][0].strategy != "single", k[2], k[3])):
        repeats = grouped[key]
        base = baseline_of(key, grouped)
        done = finished(repeats)
        metric = next((r.val_metric for r in done if r.val_metric), None)
        value = _median(repeats, lambda r: r.val_value)
        lines.append([
            *key[:2], key[2], str(key[3]), str(len(done)), status_of(repeats),
            interval_cell(epoch_time(repeats, histories, protocol), ".3f"),
            interval_cell(throughput_estimate(repeats, histories, protocol), ".1f"),
            interval_cell(speedups.get(key), ".2f"),
            f"{base[2]}/w{base[3]}" if base else "-",
            _fmt(_median(repeats, lambda r: r.peak_memory_mb), ".0f"),
            *(_fmt(_median(repeats, lambda r, k=k: r.split.get(k)), ".3f") for k in split),
            metric or "-", _fmt(value, ".4g")])
    return Table("speedup", title, ["dataset", "network", "strategy", "workers", "repeats", "status",
                                    "epoch time (s)", "samples/s", "speedup", "baseline", "peak memory (MB)",
                                    *(SPLIT_HEADERS[k] for k in split), "val metric", "final value"], lines,
                 ["repeats: the point's finished runs, aggregated once; its speedup is against the baseline point "
                  "(its repeats aggregated too), with the interval of the ratio."])

