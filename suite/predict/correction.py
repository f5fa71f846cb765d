"""A per-strategy correction of the model's step time, fitted on measured points (`make bench-model`).

The analytic model misses what a per-layer profile of the plain network does not contain (a library's per-step
hooks and dispatch, DeepSpeed's engine) and overestimates what it prices too dearly (pipelines on a shared CPU).
Two forms, each one number per strategy: `factor`, the median of measured / predicted step time, and
`per_step`, the median of measured - predicted step time in seconds (a fixed overhead per step). A strategy with
no measured point in the fit stays uncorrected. Fitted per cluster, kept in
results/calibration/<cluster>.correction.yaml beside the calibration record.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import yaml

from suite.errors import ConfigError
from suite.paths import read_record, reading, record_path

FORMS = ("factor", "per_step")


@dataclass(frozen=True)
class Observed:
    """One measured point, per training step."""

    key: str  # its strategy's overhead_key
    network: str
    predicted_s: float
    measured_s: float


@dataclass(frozen=True)
class Fit:
    form: str
    value: float  # factor: measured / predicted; per_step: seconds added to every step
    points: int
    networks: tuple[str, ...]

    def step_s(self, predicted_s: float) -> float:
        return self.value * predicted_s if self.form == "factor" else predicted_s + self.value


@dataclass(frozen=True)
class Correction:
    fits: dict[str, Fit]  # per strategy overhead_key
    date: str

    def step_s(self, strategy, predicted_s: float) -> float:
        fit = self.fits.get(strategy.overhead_key)
        return predicted_s if fit is None else fit.step_s(predicted_s)

    def source(self) -> str:
        """What it was fitted on, for a report's notes."""
        networks = sorted({n for fit in self.fits.values() for n in fit.networks})
        points = sum(fit.points for fit in self.fits.values())
        return f"fitted on {points} points of {', '.join(networks)}, {self.date}"


def _value(form: str, group: list[Observed]) -> float:
    if form == "factor":
        return statistics.median(o.measured_s / o.predicted_s for o in group)
    return statistics.median(o.measured_s - o.predicted_s for o in group)


def fit(observed: list[Observed], form: str, leave_out: str | None = None) -> Correction:
    """One `form` fit per strategy on the observed points, without those of network `leave_out` (scoring a
    network the fit never saw)."""
    by: dict[str, list[Observed]] = defaultdict(list)
    for o in observed:
        if o.network != leave_out:
            by[o.key].append(o)
    fits = {key: Fit(form, _value(form, group), len(group), tuple(sorted({o.network for o in group})))
            for key, group in sorted(by.items())}
    return Correction(fits, date.today().isoformat())


def correction_path(cluster: str) -> Path:
    """Beside the cluster's calibration record."""
    return record_path(cluster).with_name(f"{cluster}.correction.yaml")


def save(correction: Correction, path: Path) -> None:
    strategies = {key: {"form": f.form, "value": f.value, "points": f.points, "networks": list(f.networks)}
                  for key, f in correction.fits.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"date": correction.date, "strategies": strategies}, sort_keys=False))


def load(path: Path) -> Correction | None:
    if not path.exists():
        return None
    record = read_record(path)
    with reading(path):
        fits = {key: Fit(f["form"], float(f["value"]), int(f["points"]), tuple(f["networks"]))
                for key, f in record["strategies"].items()}
        return Correction(fits, str(record["date"]))


def required(cluster: str) -> Correction:
    """The cluster's fitted correction, for the variant `fitted`; where there is none, ConfigError saying how to
    fit one."""
    path = correction_path(cluster)
    fitted = load(path)
    if fitted is None:
        raise ConfigError(f"no fitted correction for cluster {cluster} ({path}): `make bench-model` fits one on "
                          "this machine's measured grid")
    return fitted
