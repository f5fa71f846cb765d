"""Measured values of a cell (the repeats of one point) under a named timing protocol, with their uncertainty.

Under both timing protocols (a report names its protocol in each table header) an epoch is one pass over the whole
training set: each epoch's time is scaled by the training set's size over the samples the epoch trained, so that
every framework's epoch is the same work. Frameworks' batch rules give different global batches, so a sweep that
fixes `steps_per_epoch` trains different numbers of samples per epoch (Study N's miniature: 2 steps of 8 or of 16
samples), and a large batch drops more of the last partial batch (GPipe's 3072 on MNIST trains 2.6% fewer samples
than Horovod's): raw epoch times of such runs compare unequal work.
- `suite`: the suite's own: the mean epoch time after an untimed warm-up; a run that had no warm-up
  (warmup_steps=0) has its first epoch dropped, when it has more than one.
- `study_j`: Study J's: the mean over all epochs, the first included (its runs have no warm-up either).
A cell's value and 95% interval are over its repeats (one value each: the run's mean epoch), or, with one repeat, over
that run's epochs; analysis.stats says which interval at which count, and each estimate says what it spans.
"""

from __future__ import annotations

from collections import defaultdict

from analysis.runs import Row
from analysis.stats import EPOCHS, REPEATS, Estimate, estimate, ratio
from suite.shared_names import Status

EQUAL_WORK = "each epoch scaled to one pass over the whole training set, the same samples for every framework"
PROTOCOLS = {
    "suite": "s/epoch, suite protocol: mean over epochs after an untimed warm-up "
             f"(first epoch dropped when a run had none), {EQUAL_WORK}",
    "study_j": f"s/epoch, Study J protocol: mean of all epochs, the first included, {EQUAL_WORK}",
}


class Histories:
    """Per-epoch metric histories of runs, each read from the store once."""

    def __init__(self, client) -> None:
        self._client = client
        self._read: dict[tuple[str, str], tuple[tuple[int, float], ...]] = {}

    def get(self, run_id: str, metric: str) -> tuple[tuple[int, float], ...]:
        if (run_id, metric) not in self._read:
            history = self._client.get_metric_history(run_id, metric)
            self._read[run_id, metric] = tuple(sorted((m.step, m.value) for m in history))
        return self._read[run_id, metric]


def full_pass(row: Row) -> float:
    """The training set's size over the samples one epoch of the run trained: what scales its epoch time to one
    pass over the whole set (above 1 where the last partial batch was dropped, or steps_per_epoch cut the epoch
    short). 1 for a run recorded without the training set's size."""
    trained, whole = row.metrics.get("samples_per_epoch"), row.metrics.get("train_set_samples")
    return whole / trained if trained and whole else 1.0


def protocol_epochs(row: Row, histories: Histories, protocol: str, metric: str = "epoch_time_s") -> list[float]:
    """The per-epoch values (epoch times, or throughputs) of one run that the protocol averages."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"timing protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    times = [value for _, value in histories.get(row.run_id, metric)]
    if protocol == "suite" and int(row.params.get("warmup_steps", 0)) == 0 and len(times) > 1:
        times = times[1:]
    if metric == "epoch_time_s":
        return [t * full_pass(row) for t in times]
    return times


def cell_key(row: Row) -> tuple:
    return row.dataset, row.network, row.label, row.workers


def cells(rows: list[Row]) -> dict[tuple, list[Row]]:
    """Rows grouped by point without its repeat index: (dataset, network, label, workers) -> repeats."""
    grouped: dict[tuple, list[Row]] = defaultdict(list)
    for row in rows:
        grouped[cell_key(row)].append(row)
    return dict(grouped)


def finished(repeats: list[Row]) -> list[Row]:
    return [r for r in repeats if r.status == Status.finished]


def samples(repeats: list[Row], histories: Histories, protocol: str, metric: str = "epoch_time_s") -> list[float]:
    """One value per finished repeat; with a single repeat, its per-epoch values (for the interval)."""
    done = finished(repeats)
    per_run = [protocol_epochs(r, histories, protocol, metric) for r in done]
    per_run = [times for times in per_run if times]
    if len(per_run) == 1:
        return per_run[0]
    return [sum(times) / len(times) for times in per_run]


def _statistic(repeats: list[Row]) -> str:
    """Over repeats the median; over the epochs of a single run their mean, the run's epoch time."""
    return "mean" if len(finished(repeats)) == 1 else "median"


def spanned(repeats: list[Row]) -> str:
    """What a cell's samples are: its repeats, or the epochs of its one finished run."""
    return EPOCHS if len(finished(repeats)) == 1 else REPEATS


def _cell_estimate(repeats: list[Row], histories: Histories, protocol: str, metric: str) -> Estimate | None:
    values = samples(repeats, histories, protocol, metric)
    return estimate(values, _statistic(repeats), over=spanned(repeats)) if values else None


def epoch_time(repeats: list[Row], histories: Histories, protocol: str) -> Estimate | None:
    return _cell_estimate(repeats, histories, protocol, "epoch_time_s")


def throughput_estimate(repeats: list[Row], histories: Histories, protocol: str) -> Estimate | None:
    return _cell_estimate(repeats, histories, protocol, "throughput_samples_s")


def cell_ratio(repeats: list[Row], other: list[Row], histories: Histories, protocol: str,
               metric: str = "epoch_time_s") -> Estimate | None:
    """This cell's `metric` over the other cell's, each aggregated as every view aggregates a cell, with the interval
    of the ratio; None where either has no samples."""
    mine = samples(repeats, histories, protocol, metric)
    theirs = samples(other, histories, protocol, metric)
    if not mine or not theirs:
        return None
    over = spanned(repeats) if spanned(repeats) == spanned(other) else f"{spanned(repeats)} (against: " \
        f"{spanned(other)})"
    if _statistic(repeats) != _statistic(other):  # one side repeated, the other not: compare medians
        return ratio(mine, theirs, over=over)
    return ratio(mine, theirs, _statistic(repeats), over=over)


def speedup(repeats: list[Row], baseline: list[Row], histories: Histories, protocol: str) -> Estimate | None:
    """This cell's throughput (samples/s) over the baseline's: Study J's epoch-time ratio when both epochs are
    one pass over the same data, and still a fair ratio when a sweep fixes steps_per_epoch."""
    return cell_ratio(repeats, baseline, histories, protocol, "throughput_samples_s")


def status_of(repeats: list[Row]) -> str:
    """`finished`, or the status of the newest repeat that did not finish (with its error line)."""
    if finished(repeats):
        return Status.finished
    last = max(repeats, key=lambda r: r.start_time)
    return f"{last.status}: {last.error}" if last.error else last.status
