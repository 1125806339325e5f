"""A ladder's plot: each seed's point, each law, its bootstrap band (the percentile interval of
the resamples' laws at each compute, by hand) and the held-out rung, on log–log axes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmcore.ladder.fits import Point, fit_ladder
from tests.helpers.runs import PNG

pytest.importorskip("scipy.optimize", reason="needs scipy (a dependency of lmcore)")


def points(seeds: int = 2, rungs: int = 4) -> list[Point]:
    g = np.random.default_rng(0)
    return [Point(v, s, r, params=10 ** (r + 5), tokens=10**8, flops=10.0 ** (r + 12),
                  loss=(1.8 + 2e3 * (k * 10.0 ** (r + 12)) ** -0.3) * math.exp(g.normal(0, 2e-3)))
            for v, k in (("base", 1.0), ("pos=nope", 0.7)) for r in range(rungs)
            for s in range(seeds)]  # fmt: skip


def spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from matplotlib.figure import Figure

    drawn: list[Any] = []
    save = Figure.savefig

    def keep(fig: Any, *args: Any, **kwargs: Any) -> Any:
        drawn.append(fig.axes[0])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return drawn


def test_the_band_is_the_percentile_interval_of_the_resamples_laws() -> None:
    from lmcore.ladder.report import band, compute_grid

    fit = fit_ladder(points(), baseline="base", bootstrap=40)
    grid = compute_grid(fit)
    assert grid[0] < 1e12 and grid[-1] > 1e15 and len(grid) > 50
    v = fit.variant("pos=nope")
    shade = band(v, grid, 0.9)
    assert shade is not None
    for i in (0, 17, len(grid) - 1):
        by_hand = sorted(r.predict(grid[i]) for r in v.replicates if r is not None)
        # 40 resamples, 90 %: ranks ⌊0.05·39⌋ = 1 and ⌈0.95·39⌉ = 38
        assert (shade[0][i], shade[1][i]) == (pytest.approx(by_hand[1]), pytest.approx(by_hand[38]))
    one = fit_ladder(points(seeds=1), baseline="base", bootstrap=40)
    assert band(one.variant("pos=nope"), grid, 0.95) is None  # one seed: no resamples, no band


def test_the_plot_draws_points_laws_bands_and_the_held_out_rung(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmcore.ladder.report import plot_ladder

    drawn = spy(monkeypatch)
    fit = fit_ladder(points(), baseline="base", bootstrap=20)
    plot_ladder(fit, tmp_path / "ladder.png", "rope vs nope")
    assert (tmp_path / "ladder.png").read_bytes()[:8] == PNG
    (ax,) = drawn
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    m = fit.variant("pos=nope").multiplier
    assert labels[0].startswith("base (baseline), α = ")
    assert f"multiplier {m.value:.3g}× [{m.low:.3g}, {m.high:.3g}]" in labels[1]
    assert "held-out rung 3" in labels[2]
    lines = ax.get_lines()
    # each variant: its seeds' points, every run one point, ...
    runs = [ln for ln in lines if ln.get_linestyle() == "None" and len(ln.get_xdata()) == 8]
    assert len(runs) == 2 and sorted(runs[0].get_ydata()) == sorted(
        p.loss for p in fit.variant("base").points
    )
    # ... its law, its law without the held-out rung (dotted) and that law's prediction (×)
    held = [ln for ln in lines if ln.get_marker() == "x"]
    assert [(ln.get_xdata()[0], ln.get_ydata()[0]) for ln in held] == [
        (h.flops, h.predicted) for v in fit.variants if (h := v.held_out) is not None
    ]
    assert len(ax.collections) == 2  # a band each


def test_without_a_held_out_rung_the_target_is_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmcore.ladder.report import plot_ladder

    drawn = spy(monkeypatch)
    fit = fit_ladder(points(seeds=1, rungs=3), baseline="base", bootstrap=0, target_flops=1e16)
    plot_ladder(fit, tmp_path / "three.png")
    (ax,) = drawn
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "target compute C* = 1e+16" in labels[-1] and not ax.collections
    assert not any("held-out" in s for s in labels)
