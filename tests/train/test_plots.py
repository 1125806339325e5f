"""A sweep's plot: a band per variant, the mean and range of its seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.runs import PNG


def test_a_band_is_the_mean_and_range_of_the_seeds_at_each_evaluation(tmp_path: Path) -> None:
    from lmcore.train.plots import Band, band_points, plot_bands

    def evals(*losses: float) -> list[dict[str, Any]]:
        return [{"kind": "eval", "tokens": 100 * i, "val_loss": v} for i, v in enumerate(losses)]

    runs = [evals(7.0, 5.0, 4.0), evals(7.2, 5.3, 4.3), evals(7.1, 5.2)]  # the last still running
    xs, mean, low, high = band_points(runs)
    assert xs == [0.0, 100.0, 200.0]
    assert mean == pytest.approx([7.1, 15.5 / 3, 4.15])
    assert (low, high) == ([7.0, 5.0, 4.0], [7.2, 5.3, 4.3])
    plot_bands([Band("baseline", runs)], tmp_path / "b.png", "t")
    assert (tmp_path / "b.png").read_bytes()[:8] == PNG
