"""Benchmark: the performance model against measurement on this machine (`make bench-model`).

Measures the grid of conf/sweep/model_bench.yaml through the suite's own driver (a point with a finished run
is not measured again; `--force` measures again, `--repeats N` N times, as N passes over the grid), predicts
every point with the model (suite/predict, from this machine's calibration record and the library overhead
measured on probe networks, both by `make calibrate`), and prints the per-point errors, the per-strategy median /
p90 / max / bias of the epoch-time error beside the measurements' own spread, the memory error, fits accuracy, and
the recommender's top-1, regret and Kendall tau per cell. Nothing of the model itself is fitted to these
measurements, so those scores are held out. Points of more ranks than the fewest the links were calibrated among
(the grid's 4-worker points here, with `make calibrate` at 2 ranks) are scored apart as well, priced from the
calibrations (links and library overhead) of fewer ranks than theirs: held out by worker count (and, where `make
calibrate ARGS=workers=4` measured them, beside their prediction from the calibration of their own ranks).

Then a per-strategy correction (suite.predict.correction) in both forms, a factor and a per-step overhead, scored
in-sample (fitted on every network) and leave-one-network-out (each network's points corrected by the fit on the
other networks' points) and, where the grid has them, on the points held out by worker count with the fit on
the others; the form with the smaller leave-one-network-out median error, fitted on every point, is written to
results/calibration/<cluster>.correction.yaml, which `make predict` and `make recommend` add with `--variant fitted`.

`--sweep pipelines` (or any sweep) scores the model on that sweep's grid instead, its runs as `make sweep` records
them (measured here where it has none); the correction is then printed, not written.

    python -m suite.tools.benchmarks.model [--sweep NAME] [--strategies ddp,zero] [--repeats N] [--force]
                                           [--retry-failed] [override ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from functools import cache

from analysis.model_score import Scored, cell_name, point_table, recommender_table, strategy_table
from analysis.tables import Table
from suite.errors import ConfigError
from suite.predict.correction import FORMS, Correction, Observed, correction_path, fit, save
from suite.predict.links import calibrated_links, link_model
from suite.predict.predictor import Prediction, predict, recorded_prediction
from suite.records.run_schema import run_status
from suite.records.store import Store
from suite.shared_names import Status
from suite.sweep.driver import run_sweep
from suite.sweep.plan import InvalidPoint, Point, plan
from suite.sweep.sweep_files import sweep_jobs
from suite.tools.predict import describe

SWEEP = "model_bench"
STUDY_J_STRATEGIES = ("ddp", "horovod", "gpipe", "gpipe_dist", "1f1b")  # where --variant study_j has equations


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=SWEEP,
                        help=f"score the model on this sweep's grid (its runs, measured where it has none), e.g. "
                        f"pipelines or sharded; the correction is written from {SWEEP} only")
    parser.add_argument("--strategies", help="only the points of these strategies (comma-separated)")
    parser.add_argument("--repeats", type=int, help="measure every point N times (the spread comes from them)")
    parser.add_argument("--force", action="store_true", help="measure points that have a finished run again")
    parser.add_argument("--retry-failed", action="store_true",
                        help="measure points whose last run did not finish again (they are not, by default)")
    parser.add_argument("overrides", nargs="*", help="applied to every point, e.g. steps_per_epoch=2 (a smoke run)")
    return parser.parse_intermixed_args(argv)


def strategy_of(job: list[str]) -> str | None:
    """The strategy a point's overrides name (the last `strategy=`)."""
    return next((o.split("=", 1)[1] for o in reversed(job) if o.startswith("strategy=")), None)


def identity(point: Point) -> tuple[str, ...]:
    """A point without its repeat index: its repeats are measurements of one thing."""
    return tuple(o for o in point.overrides if not o.startswith("repeat="))


def measured(store: Store, points: list[Point]) -> tuple[str, float | None, float | None, float | None]:
    """(status, epoch time, peak memory, spread) of a point's repeats: medians of the finished ones; the spread
    is their coefficient of variation, or with one run that of its epochs."""
    runs = [store.speaking_run(p.cfg.tracking.experiment, p.config_hash) for p in points]
    done = [r for r in runs if r is not None and run_status(r) == Status.finished]
    if not done:
        statuses = [run_status(r) for r in runs if r is not None]
        return (statuses[0] if statuses else "not run"), None, None, None
    times = [r.data.metrics["epoch_time_s_mean"] for r in done]
    if len(times) == 1:
        times = [m.value for m in store.client.get_metric_history(done[0].info.run_id, "epoch_time_s")]
    spread = statistics.stdev(times) / statistics.mean(times) if len(times) > 1 else None
    memory = statistics.median(r.data.metrics["peak_memory_mb"] for r in done)
    return Status.finished, statistics.median(r.data.metrics["epoch_time_s_mean"] for r in done), memory, spread


def fewest_link_ranks(point: Point) -> int | None:
    """The fewest ranks the point's cluster calibrated its links among (in the point's scope), if any."""
    return _fewest_link_ranks(point.cfg.cluster.name, point.cfg.nodes)


@cache  # the records are read once per run, not for every point and table
def _fewest_link_ranks(cluster: str, nodes: int) -> int | None:
    links = calibrated_links(cluster, nodes)
    return links[0].world_size if links else None


def held_out_by_ranks(point: Point) -> bool:
    """Whether the point has more workers than the fewest ranks its cluster was calibrated on: priced from the
    calibrations of fewer, it is held out by worker count."""
    fewest = fewest_link_ranks(point)
    return fewest is not None and point.cfg.workers > fewest


def scored_points(points: list[Point], store: Store, variant: str,
                  fewer_ranks: bool = False) -> list[tuple[Scored, Prediction]]:
    """Each point (its repeats together) scored: the model's prediction, uncorrected, against the measurement;
    `fewer_ranks`: those held out by worker count priced from links measured among fewer ranks."""
    groups: dict[tuple[str, ...], list[Point]] = {}
    for point in points:
        groups.setdefault(identity(point), []).append(point)
    scored = []
    for same in groups.values():
        first = same[0]
        prediction = predict(first, variant, fewer_ranks and held_out_by_ranks(first))
        status, seconds, memory, spread = measured(store, same)
        cfg = first.cfg
        cell = cell_name(cfg.dataset.name, cfg.network.name, cfg.cluster.name, cfg.workers,
                         cfg.cluster.hardware.device_memory_gb)
        scored.append((Scored(describe(first), first.strategy.name, cell, prediction.epoch_s, prediction.peak_mb,
                              prediction.fits, status, seconds, memory, spread), prediction))
    return scored


def network(prediction: Prediction) -> str:
    """What a fit leaves out to score a point on networks it was not fitted on: the point's network family (two
    sizes of GPT-2 are not two networks the fit has never seen)."""
    return prediction.point.cfg.network.family


def observed(scored: list[tuple[Scored, Prediction]]) -> list[Observed]:
    """The measured points, per step, as a correction is fitted on them."""
    return [Observed(p.point.strategy.overhead_key, network(p), s.predicted_s / p.steps, s.measured_s / p.steps)
            for s, p in scored if s.measured_s is not None]


def _with(correction: Correction, scored: Scored, prediction: Prediction) -> Scored:
    step = correction.step_s(prediction.point.strategy, scored.predicted_s / prediction.steps)
    return replace(scored, predicted_s=prediction.steps * step)


def corrected(scored: list[tuple[Scored, Prediction]], form: str, held_out: bool) -> list[Scored]:
    """Every point's prediction corrected by the `form` fit on all points, or `held_out` on the points of the
    other networks only."""
    points = observed(scored)
    fits = {n: fit(points, form, leave_out=n if held_out else None) for n in {network(p) for _, p in scored}}
    return [_with(fits[network(p)], s, p) for s, p in scored]


def corrected_beyond(scored: list[tuple[Scored, Prediction]], held: list[tuple[Scored, Prediction]],
                     form: str) -> list[Scored]:
    """The points held out by worker count (`held`, priced from links of fewer ranks), corrected by the `form`
    fit on the other points."""
    within = fit(observed([(s, p) for s, p in scored if not held_out_by_ranks(p.point)]), form)
    return [_with(within, s, p) for s, p in held]


def fits_table(corrections: dict[str, Correction]) -> Table:
    """Both forms' fits on every point, side by side."""
    factor, per_step = corrections["factor"].fits, corrections["per_step"].fits
    rows = [[key, f"x{factor[key].value:.3f}", f"{per_step[key].value * 1e3:+.1f}", str(factor[key].points),
             ", ".join(factor[key].networks)] for key in factor]
    return Table("model_correction", "Correction fitted per strategy on every point (measured against the model)",
                 ["strategy", "factor", "per-step (ms)", "points", "networks"], rows)


def median_error(points: list[Scored]) -> float:
    return statistics.median(abs(p.time_error) for p in points if p.time_error is not None)


def print_corrections(scored: list[tuple[Scored, Prediction]], held: list[tuple[Scored, Prediction]],
                      cluster: str, write: bool) -> None:
    """Both forms of the correction scored in-sample and held out (by network; by worker count on `held`), and
    (`write`) the better held out by network written for `make predict` and `make recommend`."""
    points = observed(scored)
    if not points:
        return
    every = {form: fit(points, form) for form in FORMS}
    print(f"\n{fits_table(every).markdown()}")
    held_out = {}
    for form in FORMS:
        held_out[form] = corrected(scored, form, held_out=True)
        tables = [(strategy_table(corrected(scored, form, held_out=False)), "in-sample (fitted on every network)"),
                  (strategy_table(held_out[form]), "leave-one-network-out"),
                  (recommender_table(held_out[form]), "leave-one-network-out")]
        if held:
            more = corrected_beyond(scored, held, form)
            how = (f"fitted on the points of at most {fewest_link_ranks(held[0][1].point)} workers, scored on those "
                   "of more (priced from calibrations of fewer ranks)")
            tables += [(strategy_table(more), how), (recommender_table(more), how)]
        for table, how in tables:
            print(f"\n{replace(table, title=f'{table.title}, corrected by {form}, {how}').markdown()}")
    if not write:
        print(f"\nno correction written: fitted on another grid than {SWEEP}'s")
        return
    best = min(FORMS, key=lambda form: median_error(held_out[form]))
    path = correction_path(cluster)
    save(every[best], path)
    others = ", ".join(f"{form} {median_error(held_out[form]):.1%}" for form in FORMS)
    print(f"\nwrote {path}: the {best} fit (held-out median |error| {others}), for make predict / recommend "
          "--variant fitted")


def held_out(points: list[Point], scored: list[tuple[Scored, Prediction]],
             store: Store) -> list[tuple[Scored, Prediction]]:
    """The points of more workers than the fewest ranks of the cluster's calibrations, priced from calibrations of
    fewer ranks than theirs (links and library overhead: held out by worker count), and their tables beside
    those of the others and, where the cluster was calibrated on more ranks too, of their own prediction."""
    far = [p for p in points if held_out_by_ranks(p)]
    if not far:
        return []
    held = scored_points(far, store, "suite", fewer_ranks=True)
    fewest = fewest_link_ranks(far[0])
    more_calibrated = len(calibrated_links(far[0].cfg.cluster.name, far[0].cfg.nodes)) > 1
    cells = {s.cell for s, _ in held}
    tables = [(strategy_table([s for s, p in scored if not held_out_by_ranks(p.point)]),
               f"points of at most {fewest} workers"),
              (strategy_table([s for s, p in scored if held_out_by_ranks(p.point) and more_calibrated]),
               f"points of more than {fewest} workers, priced from the calibrations nearest their ranks"),
              (strategy_table([s for s, _ in held]), f"points of more than {fewest} workers, held out by worker "
                                                    "count: priced from calibrations of fewer ranks"),
              (recommender_table([s for s, _ in held] + [s for s, p in scored if s.cell in cells
                                                         and not held_out_by_ranks(p.point)]),
               "cells held out by worker count")]
    for table, how in tables:
        if table.rows:
            print(f"\n{replace(table, title=f'{table.title}, {how}').markdown()}")
    return held


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        jobs = sweep_jobs(args.sweep, args.overrides, args.repeats)
        if args.strategies:  # before planning: an override the other strategies' points cannot take is no error
            jobs = [job for job in jobs if strategy_of(job) in args.strategies.split(",")]
        unrunnable: list[InvalidPoint] = []  # a study's points recorded as invalid: nothing to predict
        points = plan(jobs, experiment=args.sweep, invalid=unrunnable)
        # Repeats as passes over the whole grid, minutes apart: their spread then holds the machine's drift.
        points.sort(key=lambda p: p.cfg.repeat)
        for point in points:  # before the grid runs: a point of several ranks is priced from links it must have
            if point.processes > 1 and (missing := link_model(point.cfg.cluster, point.cfg.nodes,
                                                               point.processes).missing):
                raise ConfigError(missing)
        first = predict(points[0])
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    store = Store()
    run_sweep(points, store, force=args.force, retry_failed=args.retry_failed, predict=recorded_prediction)
    scored = scored_points(points, store, "suite")
    uncorrected = [s for s, _ in scored]
    for table in (point_table(uncorrected), strategy_table(uncorrected), recommender_table(uncorrected)):
        print(f"\n{table.markdown()}")
    held = held_out(points, scored, store)
    study_j = [p for p in points if p.strategy.name in STUDY_J_STRATEGIES]
    if study_j:
        table = strategy_table([s for s, _ in scored_points(study_j, store, "study_j")])
        title = "Study J's equations (Eq. 5.1; Eqs. 6.1 + 6.2) on the same points"
        print(f"\n{replace(table, title=title).markdown()}")
    library = first.library_by or "none measured (make calibrate)"
    print(f"\nmodel: {first.profiled_on}; links: {first.priced_by}; library overhead: {library}; the tables above "
          "fit nothing to these measurements (all held out)")
    print_corrections(scored, held, first.point.cfg.cluster.name, write=args.sweep == SWEEP)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
