"""Benchmark: the performance model against measurement on this machine (`make bench-model`).

Measures the grid of conf/sweep/model_bench.yaml through the suite's own driver (a point with a finished run
is not measured again; `--force` measures again, `--repeats N` N times), predicts every point with the model
(suite/predict, from this machine's calibration record, `make calibrate`), and prints the per-point errors, the
per-strategy median / p90 / max / bias of the epoch-time error beside the measurements' own spread, the memory
error, fits accuracy, and the recommender's top-1, regret and Kendall tau per cell. Nothing of the model is
fitted to these measurements, so every score is held out.

    python -m suite.tools.benchmarks.model [--strategies ddp,zero] [--repeats N] [--force] [override ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace

from analysis.model_score import Scored, point_table, recommender_table, strategy_table
from suite.errors import ConfigError
from suite.predict.predictor import predict
from suite.records.store import Store
from suite.sweep.driver import run_sweep
from suite.sweep.plan import Point, expand, plan, sweep_lines
from suite.tools.predict import describe
from suite.vocabulary import Status

SWEEP = "model_bench"
STUDY_J_STRATEGIES = ("ddp", "horovod", "gpipe", "gpipe_dist", "1f1b")  # where --variant study_j has equations


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", help="only the points of these strategies (comma-separated)")
    parser.add_argument("--repeats", type=int, help="measure every point N times (the spread comes from them)")
    parser.add_argument("--force", action="store_true", help="measure points that have a finished run again")
    parser.add_argument("overrides", nargs="*", help="applied to every point, e.g. steps_per_epoch=2 (a smoke run)")
    return parser.parse_intermixed_args(argv)


def identity(point: Point) -> tuple[str, ...]:
    """A point without its repeat index: its repeats are measurements of one thing."""
    return tuple(o for o in point.overrides if not o.startswith("repeat="))


def measured(store: Store, points: list[Point]) -> tuple[str, float | None, float | None, float | None]:
    """(status, epoch time, peak memory, spread) of a point's repeats: medians of the finished ones; the spread
    is their coefficient of variation, or with one run that of its epochs."""
    runs = [store.speaking_run(p.cfg.tracking.experiment, p.config_hash) for p in points]
    done = [r for r in runs if r is not None and r.data.tags.get("suite.status") == Status.finished]
    if not done:
        statuses = [r.data.tags.get("suite.status", "?") for r in runs if r is not None]
        return (statuses[0] if statuses else "not run"), None, None, None
    times = [r.data.metrics["epoch_time_s_mean"] for r in done]
    if len(times) == 1:
        times = [m.value for m in store.client.get_metric_history(done[0].info.run_id, "epoch_time_s")]
    spread = statistics.stdev(times) / statistics.mean(times) if len(times) > 1 else None
    memory = statistics.median(r.data.metrics["peak_memory_mb"] for r in done)
    return Status.finished, statistics.median(r.data.metrics["epoch_time_s_mean"] for r in done), memory, spread


def scored_points(points: list[Point], store: Store, variant: str) -> list[Scored]:
    """Each point (its repeats together) with the model's prediction and the measurement."""
    groups: dict[tuple[str, ...], list[Point]] = {}
    for point in points:
        groups.setdefault(identity(point), []).append(point)
    scored = []
    for same in groups.values():
        first = same[0]
        prediction = predict(first, variant)
        status, seconds, memory, spread = measured(store, same)
        cfg = first.cfg
        cell = f"{cfg.dataset.name}/{cfg.network.name} {cfg.cluster.name} w{cfg.workers}"
        scored.append(Scored(describe(first), first.strategy.name, cell, prediction.epoch_s, prediction.peak_mb,
                             prediction.fits, status, seconds, memory, spread))
    return scored


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        lines = sweep_lines(SWEEP, args.repeats)
        points = plan([job for line in lines for job in expand(line + args.overrides, multirun=True)], experiment=SWEEP)
        if args.strategies:
            points = [p for p in points if p.strategy.name in args.strategies.split(",")]
        first = predict(points[0])  # fails early without a calibration record
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    store = Store()
    run_sweep(points, store, force=args.force)
    scored = scored_points(points, store, "suite")
    for table in (point_table(scored), strategy_table(scored), recommender_table(scored)):
        print(f"\n{table.markdown()}")
    study_j = [p for p in points if p.strategy.name in STUDY_J_STRATEGIES]
    if study_j:
        table = strategy_table(scored_points(study_j, store, "study_j"))
        title = "Study J's equations (Eq. 5.1; Eqs. 6.1 + 6.2) on the same points"
        print(f"\n{replace(table, title=title).markdown()}")
    print(f"\nmodel: {first.profiled_on}; links: {first.priced_by}; nothing fitted to these measurements "
          "(all held out)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
