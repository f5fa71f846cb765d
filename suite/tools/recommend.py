"""`make recommend`: every strategy and its main knobs ranked by predicted epoch time for a cell, the
infeasible ones apart with the reason, and the recommendation with its predicted margin.

    python -m suite.tools.recommend [--variant study_j|fitted] dataset=... network=... cluster=...
        workers=4,8 [override ...]

One ranking per worker count; the other overrides (batch_size, optimizer.name, dataset.seq_len, ...) apply to
every candidate. Nothing is launched (profiling aside).
"""

from __future__ import annotations

import sys

from analysis.tables import Table
from suite.errors import ConfigError
from suite.predict.recommend import Ranking, rank_cell
from suite.sweep.sweep_files import parse_overrides
from suite.tools.predict import COLUMNS, NOTHING_SUBMITTED, describe, notes, parse_args, prediction_row


def worker_counts(overrides: list[str]) -> tuple[list[str], list[int]]:
    """The overrides without `workers=`, and the worker counts it lists."""
    rest, counts = [], []
    for override in overrides:
        if override.startswith("workers="):
            listed = override.removeprefix("workers=").split(",")
            if not all(n.strip().isdigit() and int(n) > 0 for n in listed):
                raise ConfigError(f"{override}: workers must be positive integers separated by commas")
            counts += [int(n) for n in listed]
        elif override.startswith("strategy"):
            raise ConfigError(f"{override}: recommend chooses the strategy; give dataset, network, cluster, workers")
        else:
            rest.append(override)
    parse_overrides(rest)
    if not counts:
        raise ConfigError("give the worker counts to recommend for, e.g. workers=2 or workers=4,8,16")
    return rest, counts


# The model's typical error: its median |error| per strategy was 1.8-14.3% on this suite's CPU grid (`make
# bench-model`, docs/measurements.md) and 8.8% over the published GPU records (`make validate-published`). A pick
# predicted faster by less than this is not told apart from the next by the model.
MODEL_ERROR = 0.10


def ranking_table(title: str, ranking: Ranking) -> Table:
    """prediction_row's columns (the step's parts add up to it; the epoch is its steps), the point's name left out."""
    rows = [[str(i), *prediction_row(p)[1:]] for i, p in enumerate(ranking.ranked, 1)]
    columns = ["rank", *COLUMNS[1:]]
    infeasible = [f"- {i.label}: {i.reason}" for i in ranking.infeasible]
    return Table("recommend", title, columns, rows, (["Infeasible:", *infeasible] if infeasible else []))


def verdict(ranking: Ranking) -> str:
    pick = ranking.pick
    if pick is None:
        return f"recommendation for {ranking.workers} workers: none (no candidate can run)"
    margin = ranking.margin
    after = "the only strategy that can run" if margin is None else (
        f"{margin:.1%} faster than the next strategy, "
        f"{describe(next(p for p in ranking.ranked if p.point.strategy.name != pick.point.strategy.name).point)}"
        + (f" (within the model's typical error of {MODEL_ERROR:.0%}: measure both before choosing)"
           if margin < MODEL_ERROR else ""))
    return f"recommendation for {ranking.workers} workers: {describe(pick.point)} ({pick.epoch_s:.3f} s/epoch), {after}"


def main(argv: list[str]) -> int:
    args = parse_args(argv, __doc__)

    def progress(k: int, n: int, point) -> None:
        print(f"[{k}/{n} {point.label}] {describe(point)}", file=sys.stderr, flush=True)

    try:
        base, counts = worker_counts(args.overrides)
        rankings = [rank_cell(base + NOTHING_SUBMITTED, workers, args.variant, progress) for workers in counts]
    except ConfigError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    cell = " ".join(base)
    for ranking in rankings:
        title = f"Strategies ranked by predicted epoch time: {cell} workers={ranking.workers}"
        table = ranking_table(title, ranking)
        predicted = ranking.ranked
        print(table.markdown() + ("\n\n" + "\n".join(notes(predicted, args.variant)) if predicted else ""))
        print(f"\n{verdict(ranking)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
