"""Scoring the performance model against measurement: per point signed errors, per strategy their median, p90,
max and bias beside the measurement's own run-to-run spread, memory errors, fits / does-not-fit accuracy, and
per cell (workload x cluster x worker count) the recommender's pick against the measured fastest: regret,
top-1 (a pick within max(3%, 2 x spread) of the best counts as right), Kendall tau of the two orders.

Signed error = predicted / measured - 1 (positive: the model is pessimistic), Study J's convention. The view
`model` of a sweep's report scores the predictions its runs recorded (`predicted_epoch_time_s`,
`predicted_peak_memory_mb`); `make bench-model` predicts afresh (also with Study J's equations).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from analysis.measure import Histories, cells, finished, samples, status_of
from analysis.runs import Row
from analysis.tables import Table
from analysis.views import Context, Section, view
from suite.shared_names import Status

TOP1_FLOOR = 0.03  # a pick this close to the measured fastest counts as right, or 2 x the spread where larger


@dataclass(frozen=True)
class Scored:
    """One point: what the model predicted, what was measured (None where it did not finish)."""

    label: str  # the strategy and its knobs
    strategy: str
    cell: str  # dataset/network, cluster, workers
    predicted_s: float
    predicted_mb: float
    predicted_fits: bool | None
    status: str  # the run's suite.status
    measured_s: float | None
    measured_mb: float | None
    spread: float | None  # relative run-to-run spread of the measured epoch time (CoV)

    @property
    def time_error(self) -> float | None:
        return None if self.measured_s is None else self.predicted_s / self.measured_s - 1

    @property
    def memory_error(self) -> float | None:
        return None if self.measured_mb is None else self.predicted_mb / self.measured_mb - 1


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-a between two orders of the same items (None with fewer than 2)."""
    n = len(xs)
    if n < 2:
        return None
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    sign = [np.sign(xs[i] - xs[j]) * np.sign(ys[i] - ys[j]) for i, j in pairs]
    return float(sum(sign) / len(pairs))


def error_summary(errors: list[float]) -> dict[str, float]:
    absolute = [abs(e) for e in errors]
    return {"n": len(errors), "median": statistics.median(absolute), "p90": float(np.percentile(absolute, 90)),
            "max": max(absolute), "bias": statistics.median(errors)}


def strategy_errors(points: list[Scored]) -> dict[str, dict[str, float]]:
    """Per strategy, over its finished points: |epoch-time error| median, p90, max; signed median (bias); the
    median spread of the measurements and the median |memory error|."""
    by: dict[str, list[Scored]] = defaultdict(list)
    for point in points:
        if point.time_error is not None:
            by[point.strategy].append(point)
    out = {}
    for strategy, group in sorted(by.items()):
        row = error_summary([p.time_error for p in group])
        spreads = [p.spread for p in group if p.spread is not None]
        row["spread"] = statistics.median(spreads) if spreads else float("nan")
        memory = [abs(p.memory_error) for p in group if p.memory_error is not None]
        row["memory"] = statistics.median(memory) if memory else float("nan")
        out[strategy] = row
    return out


def cell_name(dataset: str, network: str, cluster: str, workers: int, memory_gb: float | None) -> str:
    """A recommender's cell: workload x cluster (with the memory a rank may use, where given) x workers."""
    memory = f" {memory_gb:g} GB" if memory_gb else ""
    return f"{dataset}/{network} {cluster}{memory} w{workers}"


def fits_accuracy(points: list[Scored]) -> tuple[int, int]:
    """(right, judged): a point ran out of memory or finished, and the model said it would not fit or would."""
    judged = [p for p in points if p.predicted_fits is not None and p.status in (Status.finished, Status.oom)]
    right = sum(p.predicted_fits == (p.status == Status.finished) for p in judged)
    return right, len(judged)


@dataclass(frozen=True)
class CellScore:
    cell: str
    pick: Scored
    best: Scored
    regret: float  # T_pick / T_best - 1, measured
    right: bool  # within max(3%, 2 x spread) of the best
    tau: float | None
    candidates: int


def cell_scores(points: list[Scored]) -> list[CellScore]:
    """The recommender over each cell's measured candidates: it picks the fastest predicted among those it
    predicts to fit; a pick that did not finish is infeasible (regret infinite)."""
    by: dict[str, list[Scored]] = defaultdict(list)
    for point in points:
        by[point.cell].append(point)
    out = []
    for cell, group in sorted(by.items()):
        measured = [p for p in group if p.measured_s is not None]
        allowed = [p for p in group if p.predicted_fits is not False]
        if len(measured) < 2 or not allowed:
            continue
        pick = min(allowed, key=lambda p: p.predicted_s)
        best = min(measured, key=lambda p: p.measured_s)
        regret = pick.measured_s / best.measured_s - 1 if pick.measured_s is not None else float("inf")
        tolerance = max(TOP1_FLOOR, 2 * (best.spread or 0.0))
        tau = kendall_tau([p.predicted_s for p in measured], [p.measured_s for p in measured])
        out.append(CellScore(cell, pick, best, regret, regret <= tolerance, tau, len(measured)))
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:+.1%}" if value < 0 else f"{value:.1%}"


def point_table(points: list[Scored]) -> Table:
    rows = [[p.cell, p.label, p.status, f"{p.predicted_s:.3f}", "-" if p.measured_s is None else f"{p.measured_s:.3f}",
             _pct(p.time_error), _pct(p.spread), f"{p.predicted_mb:.0f}",
             "-" if p.measured_mb is None else f"{p.measured_mb:.0f}", _pct(p.memory_error)] for p in points]
    return Table("model_points", "Predicted against measured, per point", ["cell", "strategy", "status",
                 "predicted epoch (s)", "measured epoch (s)", "error", "spread", "predicted MB", "measured MB",
                 "memory error"], rows)


def strategy_table(points: list[Scored]) -> Table:
    rows = [[s, str(r["n"]), _pct(r["median"]), _pct(r["p90"]), _pct(r["max"]), _pct(r["bias"]), _pct(r["spread"]),
             _pct(r["memory"])] for s, r in strategy_errors(points).items()]
    right, judged = fits_accuracy(points)
    notes = [f"Fits / does not fit right in {right} of {judged} points that finished or ran out of memory."]
    return Table("model_strategies", "Epoch-time error per strategy (|predicted / measured - 1|)",
                 ["strategy", "points", "median", "p90", "max", "bias", "spread", "memory |error|"], rows, notes)


def recommender_table(points: list[Scored]) -> Table:
    cells = cell_scores(points)
    rows = [[c.cell, str(c.candidates), c.pick.label, c.best.label, _pct(c.regret), "yes" if c.right else "no",
             "-" if c.tau is None else f"{c.tau:.2f}"] for c in cells]
    notes = []
    if cells:
        finite = [c.regret for c in cells if c.regret != float("inf")]
        notes.append(f"Top-1 right in {sum(c.right for c in cells)} of {len(cells)} cells; regret mean "
                     f"{_pct(statistics.mean(finite)) if finite else '-'}, worst {_pct(max(c.regret for c in cells))}; "
                     f"infeasible picks {sum(c.regret == float('inf') for c in cells)}.")
    return Table("model_recommender", "Recommender per cell: its pick against the measured fastest",
                 ["cell", "candidates", "pick", "measured fastest", "regret", "top-1", "Kendall tau"], rows, notes)


def scored_rows(rows: list[Row], histories: Histories, protocol: str) -> list[Scored]:
    """A sweep's cells (repeats together) that recorded a prediction, scored against their measurement: the
    cell's epoch time under the report's protocol, its spread the coefficient of variation of its samples."""
    scored = []
    for (dataset, network, label, workers), repeats in cells(rows).items():
        predicted = [r for r in repeats if "predicted_epoch_time_s" in r.metrics]
        if not predicted:
            continue
        values = samples(repeats, histories, protocol)
        done = finished(repeats)
        first = predicted[0]
        memory_gb = first.params.get("cluster.hardware.device_memory_gb", "None")
        cell = cell_name(dataset, network, first.params.get("cluster.name", "?"), workers,
                         None if memory_gb == "None" else float(memory_gb))
        measured_s = (statistics.mean(values) if len(done) == 1 else statistics.median(values)) if values else None
        spread = statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else None
        memory = statistics.median(r.peak_memory_mb for r in done) if done else None
        fits = first.metrics.get("predicted_fits")
        scored.append(Scored(label, first.strategy, cell, first.metrics["predicted_epoch_time_s"],
                             first.metrics["predicted_peak_memory_mb"], None if fits is None else fits > 0.5,
                             status_of(repeats).split(":")[0],
                             measured_s, memory, spread))
    return scored


@view("model")
def model_view(ctx: Context) -> Section:
    """The performance model against this sweep's measurements, from the predictions its runs recorded."""
    scored = scored_rows(ctx.rows, ctx.histories, ctx.protocol)
    if not scored:
        return Section("Performance model", "No run of this sweep recorded a prediction (its cluster had no "
                       "calibration record when it ran: `make calibrate`).")
    tables = [point_table(scored), strategy_table(scored), recommender_table(scored)]
    return Section("Performance model", "\n\n".join(t.markdown() for t in tables),
                   [path for t in tables for path in t.write(ctx.directory)])
