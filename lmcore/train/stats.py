"""The statistics of a sweep over seeds: paired t-intervals of a variant's difference from the
baseline.

    iv = paired_interval([3.86, 3.87, 3.85], [3.69, 3.70, 3.69])   # variant, baseline by seed
    iv.mean, iv.low, iv.high, iv.distinguishable                     # +0.167, ..., True

Seed k of every variant trains on the same batches in the same order from the same kind of
initialisation (a batch is a pure function of the seed and the step), so the runs of one seed
form a pair and the seed's own luck cancels in their difference. The interval is the paired
t-interval (Student, 1908): with the differences `d_k = variant_k - baseline_k` of the `n`
seeds both finished, `mean(d) ± t(1 - α/2, n - 1) · s / √n`, `s` the sample standard deviation
(`n - 1` in its denominator) and `t` Student's t quantile (`scipy.stats.t.ppf`). A difference
is *distinguishable from zero* when the interval leaves zero out, which is the two-sided paired
t-test (`scipy.stats.ttest_rel`) rejecting "no difference" at level α. With one pair there is
no interval; with differences that are all equal (s = 0) the interval is that one value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from lmcore.errors import TrainError

CONFIDENCE: Final = 0.95


@dataclass(frozen=True)
class Interval:
    """The mean of `n` paired differences and its confidence interval (None below two)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    confidence: float = CONFIDENCE

    @property
    def distinguishable(self) -> bool:
        """Whether the interval leaves zero out (False without an interval)."""
        if self.low is None or self.high is None:
            return False
        return self.low > 0 or self.high < 0

    def to_json(self) -> dict[str, object]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n,
                "confidence": self.confidence,
                "distinguishable": self.distinguishable}  # fmt: skip


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def sample_std(values: Sequence[float]) -> float:
    """The standard deviation with `n - 1` in the denominator (NaN below two values)."""
    if len(values) < 2:
        return math.nan
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1))


def t_quantile(p: float, dof: int) -> float:
    """Student's t distribution's `p` quantile with `dof` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(p, dof))


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The t-interval of the mean of `values` (the one-sample interval the paired one uses)."""
    if not values:
        raise TrainError("no values to average")
    m, n = mean(values), len(values)
    if n < 2:
        return Interval(m, None, None, n, confidence)
    half = t_quantile(0.5 + confidence / 2, n - 1) * sample_std(values) / math.sqrt(n)
    return Interval(m, m - half, m + half, n, confidence)


def paired_interval(
    variant: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE
) -> Interval:
    """The paired t-interval of `variant - baseline`, element by element (one pair a seed)."""
    if len(variant) != len(baseline):
        raise TrainError(f"{len(variant)} values against {len(baseline)}: pairs need both")
    return mean_interval([v - b for v, b in zip(variant, baseline, strict=True)], confidence)
