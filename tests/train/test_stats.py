"""The paired t-interval of `lmcore sweep --seeds`, against scipy.stats and a hand computation."""

from __future__ import annotations

import math

import pytest

from lmcore.errors import TrainError
from lmcore.train.stats import mean_interval, paired_interval, sample_std

stats = pytest.importorskip("scipy.stats", reason="needs scipy (a dependency of lmcore)")


def test_the_paired_interval_is_scipys() -> None:
    variant = [3.861, 3.874, 3.852, 3.869]
    baseline = [3.689, 3.701, 3.694, 3.688]
    iv = paired_interval(variant, baseline)
    ref = stats.ttest_rel(variant, baseline).confidence_interval(0.95)
    assert iv.n == 4 and iv.mean == pytest.approx(sum(variant) / 4 - sum(baseline) / 4)
    assert (iv.low, iv.high) == (
        pytest.approx(ref.low, abs=1e-12),
        pytest.approx(ref.high, abs=1e-12),
    )
    assert iv.distinguishable


def test_the_interval_by_hand() -> None:
    # differences 0.1, 0.3, 0.2: mean 0.2, s = 0.1, t(0.975, 2) = 4.302652729911275
    iv = paired_interval([1.1, 1.3, 1.2], [1.0, 1.0, 1.0])
    half = 4.302652729911275 * 0.1 / math.sqrt(3)
    assert iv.mean == pytest.approx(0.2)
    assert iv.low == pytest.approx(0.2 - half) and iv.high == pytest.approx(0.2 + half)
    # the half width, 0.248, exceeds the mean: zero is inside, not distinguishable
    assert iv.low < 0 < iv.high and not iv.distinguishable


def test_distinguishable_means_the_two_sided_test_rejects() -> None:
    for variant, baseline in (([2.0, 2.1, 2.05], [1.0, 1.02, 0.99]),
                              ([1.0, 1.2, 0.9], [1.05, 1.0, 1.1])):  # fmt: skip
        iv = paired_interval(variant, baseline)
        assert iv.distinguishable == (stats.ttest_rel(variant, baseline).pvalue < 0.05)


def test_one_pair_gives_no_interval_and_equal_differences_a_point() -> None:
    one = paired_interval([3.9], [3.7])
    assert one.n == 1 and one.low is None and one.high is None and not one.distinguishable
    same = paired_interval([2.5, 3.5], [2.0, 3.0])
    assert (same.low, same.high) == (
        pytest.approx(0.5),
        pytest.approx(0.5),
    ) and same.distinguishable
    assert math.isnan(sample_std([1.0]))
    with pytest.raises(TrainError, match="2 values against 1: pairs need both"):
        paired_interval([1.0, 2.0], [1.0])


def test_the_mean_interval_is_the_one_sample_t_interval() -> None:
    values = [0.5, 0.7, 0.4, 0.9, 0.6]
    iv = mean_interval(values, 0.9)
    ref = stats.ttest_1samp(values, 0.0).confidence_interval(0.9)
    assert (iv.low, iv.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
