"""A ladder's fits as a log–log PNG, drawn with matplotlib's object API (`Figure`, the Agg
canvas; no pyplot), written atomically.

    plot_ladder(fit_ladder(points, baseline="rope"), "ladder.png", "rope vs nope")

Per variant, one colour: each seed's run as a point, the fitted law `L(C) = E + A·C^−α` as a
line, the bootstrap band (at each compute, the percentile interval of the resamples' laws, as
the table's intervals are taken), and the held-out rung: the law fitted without it, dotted, and
its prediction there as an ×. A grey line marks the held-out rung's compute, a dashed one the
target compute when it is elsewhere.
"""

from __future__ import annotations

import math
import os
import textwrap
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from lmcore.atomic import atomic_path
from lmcore.ladder.fits import LadderFit, VariantFit, interval_ranks

if TYPE_CHECKING:
    from numpy.typing import NDArray

_MARKERS: Final = ("o", "s", "^", "D", "v", "P", "X", "*", "h")
LABEL_MAX: Final = 40  # characters of a variant's name in the legend
GRID: Final = 200  # computes the curves are drawn at


def compute_grid(fit: LadderFit) -> NDArray[np.float64]:
    """The computes the curves span: from below the smallest rung to past the largest (and the
    target), evenly in log C."""
    flops = [p.flops for v in fit.variants for p in v.points] + [fit.target_flops]
    return np.geomspace(min(flops) / 1.5, max(flops) * 1.5, GRID)


def band(v: VariantFit, grid: NDArray[np.float64], confidence: float) -> (
        tuple[NDArray[np.float64], NDArray[np.float64]] | None):  # fmt: skip
    """At each compute of `grid`, the percentile interval of the bootstrap's laws (None
    without resamples)."""
    laws = [r for r in v.replicates if r is not None]
    if not laws or v.alpha.low is None:
        return None
    curves = np.sort(np.stack([law.predict(grid) for law in laws]), axis=0)
    low, high = interval_ranks(len(laws), confidence)
    return curves[low], curves[high]


def _label(v: VariantFit, baseline: str) -> str:
    name = textwrap.shorten(v.variant, LABEL_MAX, placeholder=" …")
    if v.variant == baseline:
        return f"{name} (baseline), α = {v.law.alpha:.3f}"
    m = v.multiplier
    text = f"{m.value:.3g}×" if math.isfinite(m.value) else "∞×"
    if m.low is not None and m.high is not None:
        lo, hi = (f"{x:.3g}" if math.isfinite(x) else "∞" for x in (m.low, m.high))
        text += f" [{lo}, {hi}]"
    return f"{name}, α = {v.law.alpha:.3f}, multiplier {text}"


def plot_ladder(fit: LadderFit, path: str | os.PathLike[str], title: str = "") -> None:
    """The ladder's points, laws, bands and held-out rung on log–log axes, as a PNG at `path`."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(8, 5), dpi=100)
    ax: Any = fig.add_subplot()
    grid = compute_grid(fit)
    for n, v in enumerate(fit.variants):
        color = f"C{n % 10}"  # the style's colour cycle
        ax.plot([p.flops for p in v.points], [p.loss for p in v.points],
                _MARKERS[n % len(_MARKERS)], color=color, ms=4, alpha=0.7, ls="none",
                mfc="none" if n == 0 else color, zorder=3)  # fmt: skip
        ax.plot(grid, v.law.predict(grid), color=color, lw=2 if n == 0 else 1.5,
                ls="--" if n == 0 else "-", label=_label(v, fit.baseline), zorder=2)  # fmt: skip
        shade = band(v, grid, fit.confidence)
        if shade is not None:
            ax.fill_between(grid, *shade, color=color, alpha=0.15, lw=0)
        h = v.held_out
        if h is not None:
            ax.plot(grid, h.law.predict(grid), color=color, lw=1, ls=":")
            ax.plot([h.flops], [h.predicted], "x", color=color, ms=9, mew=2, zorder=4)
    held = fit.variants[0].held_out
    if held is not None:
        ax.axvline(held.flops, color="grey", lw=1, ls=":",
                   label=f"held-out rung {held.rung}: dotted laws fitted without it, × their "
                         "predictions")  # fmt: skip
    if held is None or not math.isclose(fit.target_flops, held.flops, rel_tol=1e-9):
        ax.axvline(fit.target_flops, color="grey", lw=1, ls="--",
                   label=f"target compute C* = {fit.target_flops:.3g}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda y, _pos: f"{y:.3g}")  # losses span little of a decade
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("training compute C (FLOPs)")
    ax.set_ylabel("final validation loss (nats per token)")
    bands = f"; bands: {fit.confidence:.0%} bootstrap over seeds" if fit.resampling else ""
    ax.set_title(textwrap.fill(title or f"L(C) = E + A·C^−α per variant{bands}", 80), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
