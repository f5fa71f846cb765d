"""Sanity flags: measured values a reader should not take at face value, marked beside them in the tables and
listed on the report's first screen (the `sanity` section), never hidden.

A point is flagged for
- a superlinear speedup: its throughput over its baseline point's (the speedup table's: the workload's 1-worker
  `single`, else the same variant on the fewest workers) above the ratio of their worker counts;
- a coefficient of variation above `HIGH_CV` across the samples behind its epoch time (repeats, or epochs);
- an interval from fewer than `FEW_SAMPLES` samples;
- a phase time (data, forward, backward, optimizer, communication) below `TIMER_RESOLUTION_S` per step: a phase that
  ran inside another (torchgpipe's backward runs in forward's autograd graph) measures nothing, not a fast phase;
- training other samples per epoch than most points of its workload on as many workers (its peers in a comparison at
  that count): its raw epoch time is other work (the report's times are per pass over the training set,
  analysis.measure).
"""

from __future__ import annotations

from collections import Counter

from analysis.measure import cell_key, cells, epoch_time, finished, speedup
from analysis.runs import Row
from analysis.speedup import baseline_of
from analysis.tables import Table
from analysis.views import Context, Section, view
from suite.shared_names import PHASE_TIMES

HIGH_CV = 0.20
FEW_SAMPLES = 5
TIMER_RESOLUTION_S = 1e-4


def _baseline(ctx: Context, row: Row) -> tuple[list[Row], int] | None:
    """The repeats of the point `row`'s speedup is measured against, and its worker count; None for itself or none."""
    grouped, key = cells(ctx.rows), cell_key(row)
    base = baseline_of(key, grouped)
    return None if base is None or base == key else (grouped[base], base[3])


def _peers(row: Row) -> tuple:
    return *row.workload, row.workers


def _usual_samples(ctx: Context) -> dict[tuple, float]:
    """Per workload and worker count, the samples per epoch most of its finished points train."""
    counts: dict[tuple, Counter] = {}
    for r in finished(ctx.rows):
        if "samples_per_epoch" in r.metrics:
            counts.setdefault(_peers(r), Counter())[r.metrics["samples_per_epoch"]] += 1
    return {peers: c.most_common(1)[0][0] for peers, c in counts.items()}


def point_flags(ctx: Context, repeats: list[Row], usual: dict[tuple, float] | None = None) -> list[str]:
    """What is suspect about one point (its repeats), in words; [] when nothing is."""
    done = finished(repeats)
    if not done:
        return []
    row, flags = done[0], []
    t = epoch_time(repeats, ctx.histories, ctx.protocol)
    if t is not None and t.cv is not None and t.cv > HIGH_CV:
        flags.append(f"CV {t.cv:.0%}")
    if t is not None and t.n < FEW_SAMPLES:
        flags.append(f"interval from {t.n} sample(s)")
    baseline, workers = _baseline(ctx, row) or ([], row.workers)
    if row.workers > workers:
        s = speedup(repeats, baseline, ctx.histories, ctx.protocol)
        if s is not None and s.value > row.workers / workers:
            single = baseline[0].strategy == "single" and workers == 1
            over = "" if single else f" over {baseline[0].label} on {workers}"
            flags.append(f"superlinear speedup {s.value:.3g}x on {row.workers} workers{over}")
    for phase in (*PHASE_TIMES, "time_comm_s"):
        values = [r.metrics[phase] for r in done if phase in r.metrics]
        if values and 0 < sum(values) / len(values) < TIMER_RESOLUTION_S:
            flags.append(f"{phase.removeprefix('time_').removesuffix('_s')} {sum(values) / len(values):.1e} s/step, "
                         "below the timer's resolution (measured inside another phase)")
    usual = _usual_samples(ctx) if usual is None else usual
    mine = row.metrics.get("samples_per_epoch")
    if mine is not None and _peers(row) in usual and mine != usual[_peers(row)]:
        flags.append(f"{mine:g} samples an epoch where its peers on {row.workers} worker(s) train "
                     f"{usual[_peers(row)]:g}")
    return flags


def flag_cell(ctx: Context, repeats: list[Row]) -> str:
    """A table's `flags` cell: the point's flags joined, or empty."""
    return "; ".join(point_flags(ctx, repeats))


@view("sanity")
def sanity_view(ctx: Context) -> Section:
    """One row per flagged point; a flag every point carries (two epochs each: an interval from 2 samples) is said
    once above the table instead, so that the points flagged for something of their own stand out."""
    usual = _usual_samples(ctx)
    flagged = {key: point_flags(ctx, repeats, usual) for key, repeats in sorted(cells(ctx.rows).items())
               if finished(repeats)}
    everywhere = set.intersection(*(set(f) for f in flagged.values())) if len(flagged) > 1 else set()
    rows = [[d, n, label, str(w), "; ".join(f for f in flags if f not in everywhere)]
            for (d, n, label, w), flags in flagged.items() if set(flags) - everywhere]
    common = [f"Every point: {'; '.join(f for f in next(iter(flagged.values())) if f in everywhere)}."] \
        if everywhere else []
    table = Table("sanity_flags", f"{ctx.experiment}: values not to take at face value",
                  ["dataset", "network", "strategy", "workers", "flags"], rows,
                  [*common, f"Flagged: a speedup above the worker count, a CV above {HIGH_CV:.0%}, an interval from "
                   f"fewer than {FEW_SAMPLES} samples, a phase below {TIMER_RESOLUTION_S:g} s per step, other samples "
                   "per epoch than most points of the workload on as many workers. The epoch tables mark the same "
                   "points in their `flags` column."])
    return Section("Sanity flags", table.markdown(), table.write(ctx.directory))
