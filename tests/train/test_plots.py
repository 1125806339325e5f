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


def test_the_comparison_shows_step_0_and_an_identical_variant_leaves_the_baseline_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    from lmcore.train.plots import Band, Curve, plot_bands, plot_compare

    drawn: list[Any] = []
    save = Figure.savefig

    def spy(fig: Any, *args: Any, **kwargs: Any) -> Any:
        drawn.append(fig.axes[0])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    losses = ((0, 5.70), (10, 3.10), (20, 2.60), (30, 2.40))
    records = [{"kind": "eval", "step": s, "tokens": s * 64, "val_loss": v} for s, v in losses]
    plot_compare([Curve("baseline", records), Curve("norm=rmsnorm", records)],
                 tmp_path / "c.png", "t")  # fmt: skip
    plot_bands([Band("baseline", [records, records]), Band("pos=nope", [records, records])],
               tmp_path / "b.png", "t")  # fmt: skip
    for ax in drawn:
        low, high = ax.get_ylim()
        assert low <= 2.40 and 5.70 <= high  # every evaluation, the untrained one included
        base, variant = (line for line in ax.lines if len(line.get_xdata()))
        assert list(base.get_ydata()) == list(variant.get_ydata())  # the same curve...
        assert base.get_zorder() > variant.get_zorder()  # ...under the baseline, not over it
        assert base.get_linestyle() == "--" and variant.get_linestyle() == "-"
        assert base.get_marker() != variant.get_marker() and base.get_markerfacecolor() == "none"
        assert base.get_markersize() > variant.get_markersize()  # its hollow ring shows around


def test_a_variant_as_long_as_a_whole_spec_leaves_the_plot_room(tmp_path: Path) -> None:
    import warnings

    from lmcore.train.plots import LABEL_MAX, Curve, plot_compare

    long = ", ".join(f"key_{i}=value_{i}" for i in range(20))  # 339 characters, as a --vary
    records = [{"kind": "eval", "step": s, "tokens": s, "val_loss": 5.0 - s} for s in (0, 1)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Tight layout not applied" among them
        plot_compare([Curve("baseline", records), Curve(long, records)], tmp_path / "c.png", "t")
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG and len(long) > 4 * LABEL_MAX
