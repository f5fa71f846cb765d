"""Scoring the performance model against published GPU measurements: each record's published figure beside what
the suite predicts for the point its configuration maps to (suite.published.mapping), in the record's metric and
units; the error per metric, strategy family, GPU type and source; within each source table that compares layouts
of one model, Kendall's tau of predicted against published order; and where a record states its memory per GPU, the
predicted peak's error and whether the model says it fits. A record the suite cannot express or price keeps its
reason; none is dropped.

`tflops_per_gpu` is what the GPUs execute, recomputation included, as Megatron-LM and Narayanan et al. (2021)
count it; `mfu` divides the model's FLOPs alone by the datasheet peak.

A physics check before scoring: a published figure that implies more model FLOPs per second per GPU than the GPU's
peak at the point's precision (or an MFU above 100%) contradicts what the record was mapped with (a precision
assumed, a model misread) and is reported with that reason, not scored.

Signed error = predicted / published - 1, as the CPU scores (analysis.model_score). A throughput (samples/s,
tokens/s, TFLOP/s) predicted too high is a positive error, an iteration time predicted too long also: the sign
says which way the number is off, not whether the model is optimistic.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from analysis.model_score import error_summary, kendall_tau
from analysis.tables import Table
from suite.errors import ConfigError
from suite.published.mapping import DATA_PARALLEL, GPU, PIPELINES, Mapped
from suite.published.records import Record

MEMORY = "memory_gb_per_gpu"
MEMORY_ALSO = {"memory_gib": 2**30, "memory_gb": 1e9, "memory_gb_per_gpu": 1e9}  # measured.also keys, bytes each
# the GPU pricing issue's and the model-for-every-framework issue's, printed beside what is reached
TARGETS = {"median": 0.10, "p90": 0.25, "family_median": 0.15, "source_median": 0.15, "memory_median": 0.10,
           "fits": 0.95, "tau": 0.8, "pick": 0.05, "priced": 0.85}
SHARDED = ("fsdp", "zero1", "zero2", "zero3")


@dataclass(frozen=True)
class Scored:
    record: Record
    metric: str
    published: float
    predicted: float | None
    reason: str | None = None  # why predicted is None
    priced_from: str | None = None
    fits: bool | None = None

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted / self.published - 1

    def as_json(self) -> dict:
        r = self.record
        return {"id": r.id, "metric": self.metric, "published": self.published, "predicted": self.predicted,
                "error": self.error, "reason": self.reason, "priced_from": self.priced_from, "fits": self.fits,
                "strategy": r.layout.strategy, "gpu": r.hardware.gpu, "source": r.source.ref or r.prefix}


def family(strategy: str | None) -> str:
    if strategy in SHARDED:
        return "sharded"
    if strategy in DATA_PARALLEL:
        return "data parallel"
    if strategy in PIPELINES:
        return "pipeline"
    return "tensor / 3D"


def _value(metric: str, prediction, record: Record) -> float:
    """The prediction in the record's metric; ConfigError where the metric is not one a single point prices."""
    point = prediction.point
    seq = point.cfg.dataset.seq_len if point.cfg.dataset.kind == "tokens" else None
    values: dict[str, Callable[[], float]] = {
        "tflops_per_gpu": lambda: prediction.hardware_tflops_per_device,
        "samples_per_s": lambda: prediction.samples_per_s,
        "iteration_time_s": lambda: prediction.step.total,
        "epoch_time_s": lambda: prediction.epoch_s,
        "mfu": lambda: prediction.model_tflops_per_device / _peak(point),
    }
    if seq:
        values["tokens_per_s"] = lambda: prediction.samples_per_s * seq
        values["tokens_per_s_per_gpu"] = lambda: prediction.samples_per_s * seq / point.processes
    if metric not in values:
        raise ConfigError(f"metric {metric} compares points (a speedup, a largest batch): not priced per record")
    return values[metric]()


def _peak(point) -> float:
    """The datasheet peak MFU divides by: the point's half-precision dtype, else fp32."""
    peaks = point.cfg.cluster.hardware.peak_tflops or {}
    return peaks[point.cfg.precision if point.cfg.precision in ("bf16", "fp16") else "fp32"]


TIMES = ("iteration_time_s", "epoch_time_s")  # the other priced metrics are rates


def contradiction(metric: str, published: float, predicted: float, prediction,
                  stated_tflops: float | None = None) -> str | None:
    """Why the published figure cannot be true of the point as mapped (its precision, its FLOPs): the model FLOP rate
    per GPU it implies (the prediction's, scaled by the published over the predicted speed; an MFU's own model
    TFLOP/s per GPU where its record states them, `stated_tflops`, for an MFU may be of another precision's peak)
    above the GPU's peak at the point's precision, or an MFU above 100%. None where it can be."""
    point = prediction.point
    if metric == MEMORY or not predicted or not prediction.flops_per_sample:
        return None
    try:
        peak = _peak(point)
    except (KeyError, TypeError):  # a cluster whose datasheet lacks the dtype: the pricing said so already
        return None
    if metric == "mfu":
        implied = stated_tflops or published / (100 if published > 1 else 1) * peak
    else:
        implied = prediction.model_tflops_per_device * (predicted / published if metric in TIMES else
                                                        published / predicted)
    if implied <= peak:
        return None
    precision = point.cfg.precision
    return (f"contradicts its assumptions: the published figure implies {implied:.0f} TFLOP/s of model FLOPs per "
            f"GPU, above the GPU's {precision} peak of {peak:.0f} (precision={precision}, "
            f"{prediction.flops_per_sample / 1e12:.3g} TFLOP a sample)")


def score_record(mapped: Mapped, predict: Callable) -> list[Scored]:
    """The record's primary metric, and its memory per GPU where `measured.also` states it."""
    record = mapped.record
    published = float(record.measured.value)
    memory = [(key, float(value) * scale / 1e9) for key, scale in MEMORY_ALSO.items()
              if isinstance((value := record.measured.also.get(key)), (int, float))]
    if not mapped.expressible or mapped.point is None:
        reason = "; ".join(map(str, mapped.reasons)) or "not planned"
        return ([Scored(record, record.measured.metric, published, None, reason)]
                + [Scored(record, MEMORY, gb, None, reason) for _, gb in memory[:1]])
    try:
        prediction = predict(mapped.point)
        metric = record.measured.metric
        if metric == MEMORY:
            value = prediction.memory.peak / 1e9
        else:
            value = _value(metric, prediction, record)
    except ConfigError as e:
        return [Scored(record, record.measured.metric, published, None, str(e).splitlines()[0])]
    if metric == "mfu" and published > 1:  # stated in percent
        value *= 100
    stated = record.measured.also.get("model_tflops_per_gpu")
    contradicts = contradiction(metric, published, value, prediction,
                                float(stated) if isinstance(stated, (int, float)) else None)
    if contradicts:  # reported, never scored
        return [Scored(record, metric, published, None, contradicts, prediction.priced_from)]
    scored = [Scored(record, metric, published, value, None, prediction.priced_from, prediction.fits)]
    scored += [Scored(record, MEMORY, gb, prediction.memory.peak / 1e9, None, prediction.priced_from,
                      prediction.fits) for _, gb in memory[:1]]
    return scored


def _summary_rows(groups: dict[str, list[Scored]]) -> list[list[str]]:
    rows = []
    for name, group in sorted(groups.items()):
        errors = [s.error for s in group if s.error is not None]
        if not errors:
            rows.append([name, "0", "", "", "", f"{len(group)} unpriced"])
            continue
        summary = error_summary(errors)
        rows.append([name, str(summary["n"]), f"{summary['median']:.1%}", f"{summary['p90']:.1%}",
                     f"{summary['bias']:+.1%}", f"{len(group) - len(errors)} unpriced" if len(group) > len(errors)
                     else ""])
    return rows


def grouped(scored: Iterable[Scored], key: Callable[[Scored], str]) -> dict[str, list[Scored]]:
    groups: dict[str, list[Scored]] = defaultdict(list)
    for s in scored:
        groups[key(s)].append(s)
    return groups


def throughput(scored: list[Scored]) -> list[Scored]:
    return [s for s in scored if s.metric != MEMORY]


def memory_per_gpu(scored: list[Scored]) -> list[Scored]:
    return [s for s in scored if s.metric == MEMORY]


def fits_agreed(group: list[Scored]) -> tuple[int, int]:
    """Of a group's priced records, how many the model says fit: a published record ran, so it fits."""
    stated = [s for s in group if s.fits is not None]
    return sum(bool(s.fits) for s in stated), len(stated)


def memory_table(scored: list[Scored]) -> Table:
    """Memory per GPU where a record states it: the predicted peak's error per source, over every such record last,
    and whether the model's fits agrees."""
    stating = memory_per_gpu(scored)
    rows = []
    for groups in (grouped(stating, lambda s: s.record.prefix), {"every record stating it": stating}):
        for row in _summary_rows(groups):
            agreed, priced = fits_agreed(groups[row[0]])
            rows.append([*row[:5], f"{agreed} of {priced}" if priced else "", row[5]])
    table = Table("published_memory", "Memory per GPU error per source (the predicted peak against the published)",
                  ["group", "priced", "median |error|", "p90 |error|", "bias (median signed)",
                   "fits predicted (they ran)", "not priced"], rows)
    agreed, priced = fits_agreed(stating)
    table.notes.append(f"Memory: {len(stating)} records state it; fits predicted right (they ran, so they fit) on "
                       f"{agreed} of {priced} priced.")
    return table


def summary_tables(scored: list[Scored]) -> list[Table]:
    columns = ["group", "priced", "median |error|", "p90 |error|", "bias (median signed)", "not priced"]
    main = throughput(scored)
    taus = ordering(main)
    rows = _summary_rows(grouped(scored, lambda s: s.metric)) + _summary_rows({"all throughput / time": main})
    by_metric = Table("published_by_metric", "Error per metric, and over every record last", columns, rows)
    # Per source first: one framework's many records must not carry the score of the others
    return [
        Table("published_by_source", "Throughput and time error per source (records sharing an id prefix)",
              columns, _summary_rows(grouped(main, lambda s: s.record.prefix))),
        Table("published_by_family", "Throughput and time error per strategy family", columns,
              _summary_rows(grouped(main, lambda s: family(s.record.layout.strategy)))),
        Table("published_by_gpu", "Throughput and time error per GPU type", columns,
              _summary_rows(grouped(main, lambda s: s.record.hardware.gpu or "unstated"))),
        Table("published_ordering", "Order of layouts within each source table (Kendall tau, predicted vs published) "
              "and the model's pick against the published fastest",
              ["source table", "model", "records", "tau", "model's pick", "published below the fastest"],
              [[table, model, str(o.records), f"{o.tau:+.2f}", o.pick, f"{o.shortfall:.1%}"]
               for (table, model), o in sorted(taus.items())]),
        by_metric,
        memory_table(scored),
    ]


@dataclass(frozen=True)
class Order:
    """A source table's layouts as the model orders them: Kendall's tau against the published order, and the model's
    pick (its fastest) with how far its published figure is from the published fastest (0: it is the fastest)."""

    records: int
    tau: float
    pick: str
    shortfall: float


def source_table(record: Record) -> str:
    """The table (figure, section) of its source a record is a row of: its `where` up to the row."""
    where = record.source.where or record.source.ref or ""
    return re.sub(r",?\s*\brow\b.*$", "", where).strip()


def ordering(scored: list[Scored]) -> dict[tuple[str, str], Order]:
    """Per source table (a record's source and `where`) and model, over its priced records of one metric (at least
    three): Kendall's tau of predicted against published values, and the layout the model would pick."""
    tables: dict[tuple[str, str, str], list[Scored]] = defaultdict(list)
    for s in scored:
        if s.predicted is not None:
            r = s.record
            tables[(f"{r.prefix}: {source_table(r)}", r.model.name or "", s.metric)].append(s)
    orders = {}
    for (table, model, metric), group in tables.items():
        if len(group) < 3:
            continue
        better = min if metric in TIMES else max  # the fastest: the shortest time, the highest rate
        pick = better(group, key=lambda s: s.predicted)
        fastest = better(s.published for s in group)
        shortfall = pick.published / fastest - 1 if metric in TIMES else 1 - pick.published / fastest
        tau = kendall_tau([s.predicted for s in group], [s.published for s in group])
        orders[(table, model)] = Order(len(group), tau, pick.record.id, shortfall)
    return orders


def targets(scored: list[Scored]) -> list[str]:
    """Each of the issue's targets beside what the scores reach: per source and family first, every record last."""
    main = [s.error for s in throughput(scored) if s.error is not None]
    lines = []
    for name, key, target in (("source", lambda s: s.record.prefix, "source_median"),
                              ("strategy family", lambda s: family(s.record.layout.strategy), "family_median")):
        for group, members in sorted(grouped(throughput(scored), key).items()):
            errors = [s.error for s in members if s.error is not None]
            if errors:
                median = error_summary(errors)["median"]
                mark = "met" if median <= TARGETS[target] else "NOT met"
                lines.append(f"{name} {group}: median {median:.1%} (<= {TARGETS[target]:.0%}: {mark})")
    for (table, model), o in sorted(ordering(throughput(scored)).items()):
        tau_met, pick_met = o.tau >= TARGETS["tau"], o.shortfall <= TARGETS["pick"]
        lines.append(f"ordering {table} / {model} ({o.records} records): tau {o.tau:+.2f} (>= {TARGETS['tau']}: "
                     f"{'met' if tau_met else 'NOT met'}); pick {o.pick}, {o.shortfall:.1%} below the published "
                     f"fastest (<= {TARGETS['pick']:.0%}: {'met' if pick_met else 'NOT met'})")
    stating = memory_per_gpu(scored)
    errors = [s.error for s in stating if s.error is not None]
    if errors:
        median = error_summary(errors)["median"]
        agreed, priced = fits_agreed(stating)
        lines.append(f"memory per GPU over {len(errors)} priced records: median {median:.1%} (<= "
                     f"{TARGETS['memory_median']:.0%}: {'met' if median <= TARGETS['memory_median'] else 'NOT met'}); "
                     f"fits predicted in {agreed} of {priced} (>= {TARGETS['fits']:.0%}: "
                     f"{'met' if priced and agreed >= TARGETS['fits'] * priced else 'NOT met'})")
    elif stating:
        lines.append(f"memory per GPU: none of the {len(stating)} records that state it priced")
    in_catalog = [s for s in throughput(scored) if not (s.reason and GPU in s.reason)]
    if in_catalog:
        priced = sum(s.predicted is not None for s in in_catalog)
        share = priced / len(in_catalog)
        lines.append(f"priced: {priced} of the {len(in_catalog)} records whose GPU is in the catalog, {share:.0%} "
                     f"(>= {TARGETS['priced']:.0%}: {'met' if share >= TARGETS['priced'] else 'NOT met'})")
    if main:
        summary = error_summary(main)
        lines.append(f"throughput / time over {summary['n']} priced records: median {summary['median']:.1%} "
                     f"(target <= {TARGETS['median']:.0%}), p90 {summary['p90']:.1%} (<= {TARGETS['p90']:.0%})")
    return lines
