"""Loss curves as PNG files, drawn with matplotlib's object API (`Figure`, the Agg canvas): no
pyplot, no display, no global backend switch. Files are written atomically.

    plot_run(read_metrics(run), run / "loss.png", title)          # one run: train and val loss
    plot_compare([Curve("baseline", records), ...], "val.png")    # validation curves of runs
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmcore.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Record = Mapping[str, Any]
_MARKERS = ("s", "^", "D", "v", "P", "X", "*", "h")


@dataclass(frozen=True)
class Curve:
    """One run's metrics records under a label; `diverged_at` marks where it ended, if so."""

    label: str
    records: Sequence[Record]
    diverged_at: int | None = None


def _points(records: Sequence[Record], kind: str, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind and r.get(key) is not None and math.isfinite(r[key]):
            xs.append(float(r["tokens"]))
            ys.append(float(r[key]))
    return xs, ys


def _tokens(x: float, _pos: object = None) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def _style(ax: Axes, title: str) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_title(textwrap.fill(title, 75), fontsize=10)
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats per token)")
    ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # nothing to label before the first evaluation
        ax.legend(fontsize=8)


def _save(fig: Any, path: str | os.PathLike[str]) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def plot_run(records: Sequence[Record], path: str | os.PathLike[str], title: str) -> None:
    """Train loss (each train record) and validation loss (each evaluation) against tokens."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.add_subplot()
    x, y = _points(records, "train", "loss")
    ax.plot(x, y, lw=1, alpha=0.7, label="train")
    x, y = _points(records, "eval", "val_loss")
    ax.plot(x, y, "o-", ms=3, lw=1.5, label="validation")
    for r in records:
        if r.get("kind") == "event" and r.get("event") == "diverged":
            ax.axvline(r["tokens"], color="red", ls="--", lw=1, label=f"diverged at {r['step']}")
    _style(ax, title)
    _save(fig, path)


def plot_compare(curves: Sequence[Curve], path: str | os.PathLike[str], title: str) -> None:
    """Every run's validation loss against tokens, one line each, the first (the baseline)
    dashed on top of the others, so a variant with the same curve leaves it visible; a run
    that diverged ends in an x at its last evaluation. The y axis holds every evaluation,
    the untrained model's at step 0 included."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), dpi=100)
    ax = fig.add_subplot()
    for n, curve in enumerate(curves):
        x, y = _points(curve.records, "eval", "val_loss")
        label = curve.label
        if curve.diverged_at is not None:
            label = f"{label} (diverged at step {curve.diverged_at})"
        (line,) = ax.plot(x, y, **_line_style(n), label=_label(label))
        if curve.diverged_at is not None and x:
            ax.plot(x[-1:], y[-1:], "x", ms=9, mew=2, color=line.get_color(),
                    zorder=line.get_zorder())  # fmt: skip
    _style(ax, title)
    ax.set_ylabel("validation loss (nats per token)")
    _save(fig, path)


LABEL_MAX = 60  # characters of a curve's label in the legend; compare.md holds it whole


def _label(text: str) -> str:
    """A legend label that leaves room for the plot: a long one (a whole spec given as a
    variant) cut to `LABEL_MAX` characters, at a word where it can be."""
    return textwrap.shorten(text, LABEL_MAX, placeholder=" …") if len(text) > LABEL_MAX else text


def _line_style(n: int) -> dict[str, Any]:
    """The `n`th curve's look: the first (the baseline) dashed with hollow markers, drawn
    above the others; the others solid, each its own marker, below it. A curve that
    coincides with the baseline shows through its dashes and its hollow markers."""
    if n == 0:
        return {"marker": "o", "ms": 6, "mfc": "none", "mew": 1.5, "ls": "--", "lw": 2.0,
                "zorder": 3}  # fmt: skip
    return {"marker": _MARKERS[(n - 1) % len(_MARKERS)], "ms": 3, "ls": "-", "lw": 1.5,
            "zorder": 2}  # fmt: skip


@dataclass(frozen=True)
class Band:
    """A variant's runs, one list of metrics records per seed."""

    label: str
    runs: Sequence[Sequence[Record]]


def band_points(runs: Sequence[Sequence[Record]]) -> tuple[list[float], list[float],
                                                           list[float], list[float]]:  # fmt: skip
    """At each evaluation's token count: the mean validation loss over the runs that reached
    it, and the lowest and highest."""
    at: dict[float, list[float]] = {}
    for records in runs:
        for x, y in zip(*_points(records, "eval", "val_loss"), strict=True):
            at.setdefault(x, []).append(y)
    xs = sorted(at)
    return (xs, [math.fsum(at[x]) / len(at[x]) for x in xs], [min(at[x]) for x in xs],
            [max(at[x]) for x in xs])  # fmt: skip


def plot_bands(bands: Sequence[Band], path: str | os.PathLike[str], title: str) -> None:
    """Each variant's mean validation curve over its seeds, in a band from the lowest to the
    highest seed at each evaluation, drawn as `plot_compare` draws its curves (the baseline
    dashed on top; every evaluation on the y axis)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), dpi=100)
    ax = fig.add_subplot()
    for n, band in enumerate(bands):
        xs, ys, lo, hi = band_points(band.runs)
        label = f"{_label(band.label)} ({len(band.runs)} seed{'s' * (len(band.runs) != 1)})"
        (line,) = ax.plot(xs, ys, **_line_style(n), label=label)
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    _style(ax, title)
    ax.set_ylabel(
        "validation loss (nats per token): mean,\nband from the lowest to the highest seed"
    )
    _save(fig, path)
