"""The confidence-interval arithmetic of the report (analysis.stats): what each interval is, and that it covers the
true value as often as its label says, on simulated samples."""

import statistics

import numpy as np
import pytest
from scipy import stats as scipy_stats

from analysis.stats import EPOCHS, REPEATS, SMALL, coefficient_of_variation, estimate, ratio


def coverage(n: int, trials: int, draw, truth: float, interval) -> float:
    rng = np.random.default_rng(7)
    hits = 0
    for trial in range(trials):
        e = interval(draw(rng, n), trial)
        hits += e.low <= truth <= e.high
    return hits / trials


def test_one_sample_is_its_own_value_with_no_interval():
    e = estimate([3.0], over=REPEATS)
    assert (e.value, e.low, e.high, e.cv, e.n, e.method) == (3.0, 3.0, 3.0, None, 1, "")
    assert str(e) == "3" and e.spans() == "95% no interval over 1 repeats"


def test_identical_samples_have_no_spread():
    e = estimate([2.5] * 5)
    assert (e.value, e.low, e.high, e.cv) == (2.5, 2.5, 2.5, 0.0)
    assert estimate([2.5] * 30).high == 2.5


def test_below_twenty_samples_the_interval_is_students_t_around_the_mean():
    samples = [10.0, 10.4, 9.7]
    e = estimate(samples, over=EPOCHS)
    half = scipy_stats.t.ppf(0.975, 2) * statistics.stdev(samples) / 3 ** 0.5 / statistics.fmean(samples)
    assert e.method == "t" and e.value == pytest.approx(statistics.fmean(samples))
    assert (e.low, e.high) == pytest.approx((e.value * np.exp(-half), e.value * np.exp(half)))  # on the log scale
    assert e.spans() == "95% t-interval over 3 epochs of one run"


def test_the_interval_of_a_positive_quantity_never_reaches_below_zero():
    # Two epochs of 34.2 s and 40.2 s: on the raw scale [-0.83, 75.2] s around their 37.2 s mean
    e = estimate([34.175, 40.156])
    assert e.value == pytest.approx(37.17, abs=0.01) and (e.low, e.high) == pytest.approx((13.37, 103.3), abs=0.1)
    signed = estimate([-1.0, 2.0, 0.5])  # a quantity that may be negative keeps the raw scale
    assert signed.low < 0 < signed.high and signed.high - signed.value == pytest.approx(signed.value - signed.low)


def test_from_twenty_samples_the_interval_is_a_bca_bootstrap_of_the_statistic_asked_for():
    samples = [10.0, 10.4, 9.7, 10.1, 12.0, 9.9, 10.2, 10.3, 9.8, 10.0, 10.6, 9.6] * 2
    e = estimate(samples, "median", over=REPEATS)
    assert e.method == "BCa" and e.value == statistics.median(samples) and e.n == len(samples) >= SMALL
    assert min(samples) <= e.low < e.value < e.high <= max(samples)
    assert estimate(samples, over=REPEATS) == e  # a fixed seed: a report is reproducible
    assert estimate(samples * 3).high - estimate(samples * 3).low < e.high - e.low


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_t_interval_at_few_samples_covers_the_true_mean_at_its_nominal_level(n):
    # The percentile bootstrap this replaces covered 51% at n=2, 75% at n=3, 83% at n=5.
    found = coverage(n, 4000, lambda rng, k: list(rng.normal(10.0, 0.5, k)), 10.0,
                     lambda samples, seed: estimate(samples, "mean", seed))
    assert abs(found - 0.95) < 0.015, found


def test_a_bca_interval_covers_the_true_mean_near_its_nominal_level():
    # BCa's known shortfall at small n (simulated: 93% at n=20, 94% at n=30) is why it starts at SMALL.
    found = coverage(30, 2000, lambda rng, k: list(rng.normal(10.0, 0.5, k)), 10.0,
                     lambda samples, seed: estimate(samples, "mean", seed))
    assert abs(found - 0.95) < 0.04, found


@pytest.mark.parametrize("n", [3, 25])
def test_a_ratio_interval_covers_the_true_ratio_near_its_nominal_level(n):
    def draw(rng, k):
        return list(rng.normal(8.0, 0.4, k)), list(rng.normal(2.0, 0.1, k))
    found = coverage(n, 600, draw, 4.0, lambda pair, seed: ratio(*pair, "mean", seed))
    assert abs(found - 0.95) < 0.04, found


def test_coefficient_of_variation_is_sample_stdev_over_mean():
    samples = [2.0, 4.0, 6.0]
    assert coefficient_of_variation(samples) == pytest.approx(statistics.stdev(samples) / 4.0)
    assert coefficient_of_variation([1.0]) is None
    assert estimate(samples).cv == pytest.approx(0.5)


def test_ratio_of_means_with_its_interval():
    r = ratio([8.0, 8.2, 7.9], [2.0, 2.0, 2.0], over=REPEATS)
    assert r.value == pytest.approx(statistics.fmean([8.0, 8.2, 7.9]) / 2) and r.method == "t"
    assert r.low < r.value < r.high and r.over == REPEATS
    assert ratio([6.0], [3.0]).value == 2.0 and ratio([6.0], [3.0]).low == 2.0


def test_no_samples_is_an_error():
    with pytest.raises(ValueError):
        estimate([])
