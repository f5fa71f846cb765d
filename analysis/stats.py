"""Uncertainty of a measured value: its 95% confidence interval, the samples it spans, coefficient of variation.

The samples are a point's repeats (one value per run), or, for a point run once, that run's epochs; every interval
says which (`Estimate.over`) and how many (`n`). Below SMALL samples a bootstrap cannot cover what it claims (at n=3
a percentile bootstrap is about the sample's min-max and covers the true value some 75% of the time), so the value
is the samples' mean with Student's t-interval (it assumes roughly normal samples; run-to-run noise of a timed epoch
is; on log-normal samples of 30% spread it covers 93% at n=5), taken on the log scale for positive samples (the
delta method's standard error of the log of the mean, s / (sqrt(n) mean)), so that the interval of a time or a rate
never reaches below zero, however few and spread its samples. From SMALL samples on, the value is the statistic
asked for (median over repeats, mean over epochs) with a BCa bootstrap interval (SciPy's, bias-corrected and
accelerated, fixed seed so that a report is reproducible). A ratio of two such values (a speedup) gets a t-interval
on the log of the ratio of means (Welch's degrees of freedom) below SMALL on either side, else a BCa bootstrap of
the ratio of independently resampled statistics.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import special

RESAMPLES = 2000
LEVEL = 0.95
# Fewer samples than this: Student's t; from it: BCa bootstrap. Simulated on normal samples, a 95% BCa interval of the
# mean covers 89% at n=10, 93% at 20, 94% at 30, where the t-interval covers 95% at every n.
SMALL = 20
REPEATS, EPOCHS = "repeats", "epochs of one run"  # what an interval spans (Estimate.over)

STATISTICS = {"median": np.median, "mean": np.mean}


@dataclass(frozen=True)
class Estimate:
    value: float  # the samples' mean (fewer than SMALL), else the statistic asked for (median or mean)
    low: float
    high: float
    cv: float | None  # standard deviation / mean; None for one sample
    n: int
    method: str = ""  # "t" (Student's t), "BCa" (bootstrap), "" (one sample, or no spread)
    over: str = ""  # REPEATS or EPOCHS: what the n samples are ("" where the caller did not say)

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.value:.4g}"
        cv = "" if self.cv is None else f" cv {100 * self.cv:.1f}%"
        return f"{self.value:.4g} [{self.low:.4g}, {self.high:.4g}]{cv}"

    def spans(self) -> str:
        """What the interval is, in words: `95% t-interval over 3 repeats`."""
        what = {"t": "t-interval", "BCa": "BCa bootstrap interval"}.get(self.method, "no interval")
        return f"{100 * LEVEL:.0f}% {what} over {self.n} {self.over or 'samples'}"


def coefficient_of_variation(samples: list[float]) -> float | None:
    if len(samples) < 2:
        return None
    return statistics.stdev(samples) / statistics.fmean(samples)


def _t_quantile(df: float) -> float:
    return float(special.stdtrit(df, 0.5 + LEVEL / 2))  # Student's t quantile (scipy.stats' t.ppf)


def _bca(samples: tuple[np.ndarray, ...], statistic, seed: int) -> tuple[float, float]:
    from scipy import stats  # here: a third of a second that every sweep's report would pay, most without resampling

    def vectorised(*arrays, axis=-1):
        return statistic(*arrays, axis=axis)
    with warnings.catch_warnings():  # a degenerate jackknife (a repeated value) falls back below
        warnings.simplefilter("ignore")
        found = stats.bootstrap(samples, vectorised, n_resamples=RESAMPLES, confidence_level=LEVEL, method="BCa",
                                paired=False, vectorized=True, rng=np.random.default_rng(seed))
    low, high = float(found.confidence_interval.low), float(found.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):  # BCa undefined (all resamples alike): the percentile interval
        low, high = (float(np.percentile(found.bootstrap_distribution, q))
                     for q in (50 * (1 - LEVEL), 50 * (1 + LEVEL)))
    return low, high


def estimate(samples: list[float], statistic: str = "median", seed: int = 0, over: str = "") -> Estimate:
    if not samples:
        raise ValueError("no samples to estimate from")
    values = np.asarray(samples, dtype=float)
    n, cv = len(values), coefficient_of_variation(samples)
    if n == 1 or np.ptp(values) == 0:
        return Estimate(float(values[0]), float(values[0]), float(values[0]), cv, n, "", over)
    if n < SMALL:
        mean, half = float(values.mean()), _t_quantile(n - 1) * float(values.std(ddof=1)) / math.sqrt(n)
        if values.min() > 0:  # a time or a rate: its log's interval, as a ratio's, so that no bound is negative
            return Estimate(mean, mean * math.exp(-half / mean), mean * math.exp(half / mean), cv, n, "t", over)
        return Estimate(mean, mean - half, mean + half, cv, n, "t", over)
    low, high = _bca((values,), STATISTICS[statistic], seed)
    return Estimate(float(STATISTICS[statistic](values)), low, high, cv, n, "BCa", over)


def ratio(numerator: list[float], denominator: list[float], statistic: str = "median", seed: int = 0,
          over: str = "") -> Estimate:
    """The ratio of the two samples' values (`estimate`'s), with its interval; n is the smaller side's count."""
    if not numerator or not denominator:
        raise ValueError("no samples to estimate from")
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    n = min(len(a), len(b))
    if min(len(a), len(b)) >= SMALL and (np.ptp(a) > 0 or np.ptp(b) > 0):
        stat = STATISTICS[statistic]
        low, high = _bca((a, b), lambda x, y, axis: stat(x, axis=axis) / stat(y, axis=axis), seed)
        return Estimate(float(stat(a) / stat(b)), low, high, None, n, "BCa", over)
    value = float(a.mean() / b.mean())
    # Var(log mean) ~ s^2 / (n m^2) per side; a side of one sample (or no spread) adds none.
    sides = [(float(x.var(ddof=1)) / (len(x) * float(x.mean()) ** 2), len(x) - 1) for x in (a, b) if len(x) > 1]
    se2 = sum(term for term, _ in sides)
    if se2 == 0:
        return Estimate(value, value, value, None, n, "", over)
    df = se2 ** 2 / sum(term ** 2 / dof for term, dof in sides if term > 0)  # Welch-Satterthwaite
    half = _t_quantile(df) * math.sqrt(se2)
    return Estimate(value, value * math.exp(-half), value * math.exp(half), None, n, "t", over)
