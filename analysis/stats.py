"""Uncertainty of a measured value: median, 95% bootstrap confidence interval, coefficient of variation.

The samples are a point's repeats (one value per run: their median is reported); with a single repeat, its
epochs (their mean is the run's epoch time). The bootstrap resamples them with replacement and takes the 2.5th
and 97.5th percentiles of the resampled statistic (percentile bootstrap, fixed seed so that a report is
reproducible). A ratio of two such values (a speedup) gets its interval from the ratio of independently
resampled statistics.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


STATISTICS = {"median": np.median, "mean": np.mean}


@dataclass(frozen=True)
class Estimate:
    value: float  # the statistic (median or mean) of the samples
    low: float
    high: float
    cv: float | None  # standard deviation / mean; None for one sample
    n: int

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.value:.4g}"
        cv = "" if self.cv is None else f" cv {100 * self.cv:.1f}%"
        return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]{cv}"


def _resampled(samples: list[float], statistic: str, rng: np.random.Generator) -> np.ndarray:
    values = np.asarray(samples, dtype=float)
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return STATISTICS[statistic](values[picks], axis=1)


def _interval(resampled: np.ndarray) -> tuple[float, float]:
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return float(low), float(high)


def coefficient_of_variation(samples: list[float]) -> float | None:
    if len(samples) < 2:
        return None
    return statistics.stdev(samples) / statistics.fmean(samples)


def estimate(samples: list[float], statistic: str = "median", seed: int = 0) -> Estimate:
    if not samples:
        raise ValueError("no samples to estimate from")
    low, high = _interval(_resampled(samples, statistic, np.random.default_rng(seed)))
    value = float(STATISTICS[statistic](samples))
    return Estimate(value, low, high, coefficient_of_variation(samples), len(samples))


def ratio(numerator: list[float], denominator: list[float], statistic: str = "median", seed: int = 0) -> Estimate:
    """statistic(numerator) / statistic(denominator), with the interval of the ratio of bootstrap statistics."""
    if not numerator or not denominator:
        raise ValueError("no samples to estimate from")
    rng = np.random.default_rng(seed)
    resampled = _resampled(numerator, statistic, rng) / _resampled(denominator, statistic, rng)
    low, high = _interval(resampled)
    value = float(STATISTICS[statistic](numerator) / STATISTICS[statistic](denominator))
    return Estimate(value, low, high, None, min(len(numerator), len(denominator)))
