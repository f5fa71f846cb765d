"""The confidence-interval arithmetic of the report (analysis.stats)."""

import statistics

import pytest

from analysis.stats import coefficient_of_variation, estimate, ratio


def test_one_sample_is_its_own_median_with_a_degenerate_interval():
    e = estimate([3.0])
    assert (e.value, e.low, e.high, e.cv, e.n) == (3.0, 3.0, 3.0, None, 1)
    assert str(e) == "3"


def test_identical_samples_have_no_spread():
    e = estimate([2.5] * 5)
    assert (e.value, e.low, e.high, e.cv) == (2.5, 2.5, 2.5, 0.0)


def test_interval_holds_the_median_and_lies_within_the_samples():
    samples = [10.0, 10.4, 9.7, 10.1, 12.0, 9.9, 10.2]
    e = estimate(samples)
    assert e.value == 10.1
    assert min(samples) <= e.low <= e.value <= e.high <= max(samples)
    assert e.low < e.high


def test_interval_is_reproducible_and_narrows_with_more_samples():
    few = [1.0, 2.0, 3.0]
    many = few * 10
    assert estimate(few) == estimate(few)
    assert estimate(many).high - estimate(many).low < estimate(few).high - estimate(few).low


def test_bootstrap_interval_of_two_samples_is_their_range():
    # Resampled medians of two values are the lower value, the upper value or their mean: the 2.5th and 97.5th
    # percentiles of 2000 of them are the two values themselves.
    e = estimate([4.0, 6.0])
    assert (e.low, e.value, e.high) == (4.0, 5.0, 6.0)


def test_coefficient_of_variation_is_sample_stdev_over_mean():
    samples = [2.0, 4.0, 6.0]
    assert coefficient_of_variation(samples) == pytest.approx(statistics.stdev(samples) / 4.0)
    assert coefficient_of_variation([1.0]) is None
    assert estimate(samples).cv == pytest.approx(0.5)


def test_ratio_of_medians_with_its_interval():
    r = ratio([8.0, 8.2, 7.9], [2.0, 2.0, 2.0])
    assert r.value == pytest.approx(4.0)
    assert 7.9 / 2 <= r.low <= r.value <= r.high <= 8.2 / 2
    assert ratio([6.0], [3.0]).value == 2.0 and ratio([6.0], [3.0]).low == 2.0


def test_no_samples_is_an_error():
    with pytest.raises(ValueError):
        estimate([])


def test_mean_statistic_for_the_epochs_of_one_run():
    e = estimate([1.0, 2.0, 6.0], statistic="mean")
    assert e.value == 3.0
    assert 1.0 <= e.low < 3.0 < e.high <= 6.0
