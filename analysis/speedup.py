"""Speedup table: mean epoch time and throughput of each point against its workload's 1-worker baseline.

The baseline of a (dataset, network) is its `single` run on one worker, else the run with the
fewest workers of the same strategy variant (`Row.label`). Speedup is the throughput ratio (samples/s), which equals
the epoch-time ratio when epochs cover the same data (one pass over the training set).
"""

from __future__ import annotations

from analysis.runs import SPLIT_METRICS, Row
from suite.vocabulary import Status

SPLIT_HEADERS = {"mem_params_mb": "params MB", "mem_grads_mb": "grads MB", "mem_optim_mb": "optim MB",
                 "mem_master_mb": "master MB", "comm_mb_per_step": "comm MB/step"}


def baseline_for(row: Row, rows: list[Row]) -> Row | None:
    finished = [r for r in rows if r.workload == row.workload and r.status == Status.finished and r.throughput]
    single = [r for r in finished if r.strategy == "single" and r.workers == 1]
    if single:
        return single[0]
    same = sorted((r for r in finished if r.label == row.label), key=lambda r: r.workers)
    return same[0] if same else None


def point_speedups(rows: list[Row]) -> dict[str, float]:
    """Each finished point's throughput over its baseline's (`baseline_for`), by run id: the `speedup` metric a sweep
    gives its points' runs."""
    out = {}
    for row in rows:
        base = baseline_for(row, rows)
        if base and row.throughput and row.status == Status.finished:
            out[row.run_id] = row.throughput / base.throughput
    return out


def best_speedup(rows: list[Row], speedups: dict[str, float]) -> tuple[Row, float] | None:
    """The point of the largest speedup, and that speedup (None where no point has one)."""
    scored = [(speedups[r.run_id], r) for r in rows if r.run_id in speedups]
    if not scored:
        return None
    value, row = max(scored, key=lambda pair: pair[0])
    return row, value


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def speedup_table(rows: list[Row]) -> str:
    """One line per point; the memory split and communication columns appear when some point has them
    (per rank, the largest over ranks)."""
    split = [k for k in SPLIT_METRICS if any(k in r.split for r in rows)]
    lines = [
        "| dataset | network | strategy | workers | status | epoch time (s) | samples/s | speedup | baseline "
        "| peak memory (MB) | " + "".join(f"{SPLIT_HEADERS[k]} | " for k in split) + "final val metric |",
        "|---|---|---|---:|---|---:|---:|---:|---|---:|" + "---:|" * len(split) + "---|",
    ]
    for row in rows:
        base = baseline_for(row, rows)
        measured = base and row.throughput and row.status == Status.finished
        speedup = row.throughput / base.throughput if measured else None
        baseline = f"{base.label}/w{base.workers}" if base else "-"
        metric = f"{row.val_metric} {row.val_value:.4g}" if row.val_value is not None else "-"
        lines.append(
            f"| {row.dataset} | {row.network} | {row.label} | {row.workers} | {row.status} "
            f"| {_fmt(row.epoch_time_s, '.3f')} | {_fmt(row.throughput, '.1f')} | {_fmt(speedup, '.2f')} "
            f"| {baseline} | {_fmt(row.peak_memory_mb, '.0f')} | "
            + "".join(f"{_fmt(row.split.get(k), '.3f')} | " for k in split) + f"{metric} |"
        )
    return "\n".join(lines)
