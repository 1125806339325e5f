"""A ladder's fits: per variant a scaling law of final loss in compute, a bootstrap over seeds,
the compute multiplier over the baseline, and the held-out largest rung.

    fit = fit_ladder(points, baseline="rope", target_flops=None, bootstrap=1000)
    print(fit.table(sort="multiplier"))        # Markdown; fit.to_json() for the same as data
    fit.variant("nope").multiplier             # Estimate(value, low, high, ...)

Each `Point` is one run: its variant, seed and rung, its non-embedding parameters N, tokens D,
training compute C (the declared FLOPs per token × tokens) and final validation loss.

* **The law.** Per variant, `L(C) = E + A·C^−α` (`lmcore.ladder.laws.fit_power_law`) fitted to
  every run (each seed a point). When the ladder varies N and D independently, `L(N, D) = E +
  A/N^α + B/D^β` is fitted too (`fit_chinchilla`) and reported beside it.
* **The multiplier.** At the target compute C* (by default the baseline's largest rung), the
  variant's law predicts `L_v(C*)`; the baseline's law needs `C_b = L_b⁻¹(L_v(C*))` to reach it;
  `m = C_b / C*`. m > 1: the variant is worth m× the compute; m = k exactly when the variant's
  law is the baseline's with compute scaled by k. A loss the baseline never reaches (≤ its E)
  gives m = ∞.
* **The bootstrap.** A resample keeps each rung's mean loss and redraws its seeds'
  deviations from it, as many as the rung has, with replacement (`resamples`,
  `resampled_losses`): by default from the deviations of every rung (`resampling="pooled"`:
  seed noise taken as alike across rungs, so 2 seeds a rung still give the bootstrap 2 × rungs
  deviations to draw from), or from the rung's own seeds (`"rung"`: a plain resample of the
  seeds within each rung). Each deviation is scaled by `√(n / (n − 1))` (`correct`), without
  which a resampled mean of n seeds varies by `(n − 1)/n` of what the seeds' sample variance
  says: half at 2 seeds. Every variant refits its law to each resample, starting from its full
  fit. The variants share each resample's draws, so seed k of a variant stays paired with the
  baseline's seed k (the same batches in the same order) and the multiplier's interval is a
  paired one. The interval is the percentile interval from the order statistics, no
  interpolation (`percentile_interval`); with one seed a rung there is none.
* **The held-out rung.** Each variant's law is refitted without its largest rung and predicts
  that rung's mean loss over seeds; the error (predicted − observed) and its ratio to the
  observed loss say how far the law can be trusted one rung out. It needs 4 rungs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from lmcore.errors import FitError, did_you_mean, one_of
from lmcore.ladder.laws import (
    POWER_LAW_PARAMETERS,
    Chinchilla,
    PowerLaw,
    chinchilla_problem,
    fit_chinchilla,
    fit_power_law,
)

__all__ = [
    "RESAMPLING", "Chinchilla", "Estimate", "HeldOut", "LadderFit", "Point", "PowerLaw",
    "VariantFit", "fit_chinchilla", "fit_ladder", "fit_power_law", "interval_ranks", "multiplier",
    "percentile_interval", "resampled_losses", "resamples",
]  # fmt: skip

MIN_RUNGS: Final = POWER_LAW_PARAMETERS  # one compute value per parameter of the law
HELD_OUT_RUNGS: Final = MIN_RUNGS + 1  # the held-out check refits on all rungs but one
SORT_KEYS: Final = ("multiplier", "loss")


@dataclass(frozen=True)
class Point:
    """One run of a ladder: `params` non-embedding parameters N, `tokens` D, `flops` training
    compute C (declared FLOPs per token × tokens), `loss` the final validation loss."""

    variant: str
    seed: int
    rung: int
    params: int
    tokens: int
    flops: float
    loss: float


@dataclass(frozen=True)
class Estimate:
    """A number from the full data and its bootstrap percentile interval (None without one).
    `resamples` counts the refits the interval is over; `failed` those that did not fit."""

    value: float
    low: float | None = None
    high: float | None = None
    confidence: float = 0.95
    resamples: int = 0
    failed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"value": _json(self.value), "low": _json(self.low), "high": _json(self.high),
                "confidence": self.confidence, "resamples": self.resamples,
                "failed": self.failed}  # fmt: skip


@dataclass(frozen=True)
class HeldOut:
    """The largest rung predicted by the law fitted without it."""

    rung: int
    flops: float
    observed: float  # the rung's mean loss over its seeds
    predicted: float
    law: PowerLaw  # fitted to the other rungs
    spread: float | None = None  # the rung's seeds' sample standard deviation (None: one seed)

    @property
    def error(self) -> float:
        return self.predicted - self.observed

    @property
    def relative(self) -> float:
        return self.error / self.observed

    def to_json(self) -> dict[str, Any]:
        return {"rung": self.rung, "flops": self.flops, "observed": self.observed,
                "predicted": self.predicted, "error": self.error, "relative": self.relative,
                "spread": self.spread, "law": self.law.to_json()}  # fmt: skip


@dataclass(frozen=True)
class VariantFit:
    """One variant's fits. `replicates` are the bootstrap's refits, one per resample (the
    plot's band); `multiplier` is 1 for the baseline."""

    variant: str
    points: tuple[Point, ...]
    law: PowerLaw
    alpha: Estimate
    loss_at_target: Estimate
    multiplier: Estimate
    held_out: HeldOut | None
    chinchilla: Chinchilla | None = None
    replicates: tuple[PowerLaw | None, ...] = field(default=(), repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"variant": self.variant, "law": self.law.to_json(),
                "alpha": self.alpha.to_json(), "loss_at_target": self.loss_at_target.to_json(),
                "multiplier": self.multiplier.to_json(),
                "held_out": None if self.held_out is None else self.held_out.to_json(),
                "chinchilla": None if self.chinchilla is None else self.chinchilla.to_json(),
                "runs": len(self.points)}  # fmt: skip


def _json(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


# --------------------------------------------------------------------------- the pieces


def multiplier(variant: PowerLaw, baseline: PowerLaw, target_flops: float) -> float:
    """`m = L_b⁻¹(L_v(C*)) / C*`: the compute the baseline needs to reach the variant's loss
    at `target_flops`, over it. ∞ when the baseline never reaches that loss."""
    try:
        return baseline.inverse(variant.predict(target_flops)) / target_flops
    except FitError:
        return math.inf
    except OverflowError:
        return math.inf


def percentile_interval(values: Iterable[float], confidence: float) -> tuple[float, float]:
    """The bootstrap percentile interval from the sorted values' order statistics: with `n`
    values and `q = (1 − confidence) / 2`, the `⌊q·(n − 1)⌋`th smallest and the
    `⌈(1 − q)·(n − 1)⌉`th (from 0). No interpolation, so an infinite multiplier (a resample
    whose baseline never reaches the variant's loss) is kept as the bound it is."""
    v = sorted(values)
    if not v:
        raise FitError("no bootstrap resample gave a fit: there is no interval")
    low, high = interval_ranks(len(v), confidence)
    return v[low], v[high]


def interval_ranks(n: int, confidence: float) -> tuple[int, int]:
    """The ranks (from 0) of `percentile_interval`'s bounds among `n` sorted values."""
    q = (1 - confidence) / 2
    return math.floor(q * (n - 1) + 1e-9), math.ceil((1 - q) * (n - 1) - 1e-9)


Draw = dict[int, tuple[tuple[int, int], ...]]  # {rung: the (rung, seed) of each drawn run}
RESAMPLING: Final = ("pooled", "rung")


def resamples(
    seeds: Mapping[int, Sequence[int]], count: int, seed: int, scheme: str = "pooled"
) -> list[Draw]:
    """`count` bootstrap resamples of a ladder whose rungs have `seeds` ({rung: its seeds}),
    drawn from `numpy.random.default_rng(seed)`, resample by resample, rung by rung in
    ascending order, as many runs for each rung as it has seeds, with replacement:

    * `"rung"`: from the rung's own seeds;
    * `"pooled"`: from the runs of every rung with 2 or more seeds, in (rung, seed) order: a
      rung's resample is its mean plus deviations drawn from all rungs (`resampled_losses`);
      with no such rung, from its own seeds.

    Each drawn run is named by its (rung, seed)."""
    if scheme not in RESAMPLING:
        raise FitError(
            f"resampling {scheme!r}{did_you_mean(scheme, RESAMPLING)}: expected "
            f"{' or '.join(RESAMPLING)}"
        )
    rng = np.random.default_rng(seed)
    rungs = sorted(seeds)
    pool = [(r, s) for r in rungs if len(seeds[r]) > 1 for s in seeds[r]]
    out = []
    for _ in range(count):
        draw = {}
        for r in rungs:
            among = pool if scheme == "pooled" and pool else [(r, s) for s in seeds[r]]
            draw[r] = tuple(among[i] for i in rng.integers(0, len(among), size=len(seeds[r])))
        out.append(draw)
    return out


# --------------------------------------------------------------------------- the checks


def _check_point(p: Point) -> None:
    where = f"variant {p.variant!r}, rung {p.rung}, seed {p.seed}"
    for name in ("loss", "flops"):
        v = getattr(p, name)
        number = isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
        if not number or not math.isfinite(v) or v <= 0:
            raise FitError(f"{where}: {name} {v!r}: a scaling law needs a finite, positive {name}")
    for name in ("params", "tokens"):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise FitError(f"{where}: {name} {v!r}: expected a positive whole number")


Runs = dict[int, dict[int, Point]]  # {rung: {seed: point}}


def _by_variant(points: Sequence[Point]) -> dict[str, Runs]:
    out: dict[str, Runs] = {}
    for p in points:
        _check_point(p)
        runs = out.setdefault(p.variant, {}).setdefault(p.rung, {})
        if p.seed in runs:
            raise FitError(f"variant {p.variant!r}, rung {p.rung}: seed {p.seed} appears twice")
        runs[p.seed] = p
    for v, rungs in out.items():
        for r, runs in rungs.items():
            flops = {p.flops for p in runs.values()}
            if len(flops) > 1:
                shown = ", ".join(f"{f:.4g}" for f in sorted(flops))
                raise FitError(
                    f"variant {v!r}, rung {r}: its seeds' compute differs ({shown} FLOPs): the "
                    "seeds of a rung train one model size for one number of tokens"
                )
    return out


def _check_ladder(ladder: Mapping[str, Runs], baseline: str) -> None:
    if baseline not in ladder:
        raise FitError(
            f"baseline {baseline!r} has no points{did_you_mean(baseline, ladder)}; the "
            f"variants are: {one_of(ladder)}"
        )
    base = ladder[baseline]
    if len(base) < MIN_RUNGS:
        raise FitError(
            f"the baseline {baseline!r} has {len(base)} rung{'s' * (len(base) != 1)} "
            f"({', '.join(map(str, sorted(base)))}): a saturating power law L = E + A·C^−α "
            f"needs {MIN_RUNGS} or more rungs, and the held-out check {HELD_OUT_RUNGS}"
        )
    for v, rungs in ladder.items():
        missing, extra = sorted(set(base) - set(rungs)), sorted(set(rungs) - set(base))
        if missing or extra:
            said = [f"lacks rung{'s' * (len(missing) > 1)} {', '.join(map(str, missing))}"
                    if missing else "",
                    f"has rung{'s' * (len(extra) > 1)} {', '.join(map(str, extra))} the "
                    "baseline lacks" if extra else ""]  # fmt: skip
            raise FitError(
                f"variant {v!r} {' and '.join(s for s in said if s)}; the baseline "
                f"{baseline!r} has rungs {', '.join(map(str, sorted(base)))}: every variant "
                "needs the baseline's rungs to be compared with it"
            )
        for r in sorted(base):
            if set(rungs[r]) != set(base[r]):
                raise FitError(
                    f"variant {v!r}, rung {r}: seeds {sorted(rungs[r])}, the baseline's "
                    f"{sorted(base[r])}: the bootstrap pairs seed k of each variant with the "
                    "baseline's, so each rung needs the same seeds in every variant (rerun "
                    "the missing seeds, or leave those seeds out of that rung everywhere)"
                )


# --------------------------------------------------------------------------- the fit


def resampled_losses(
    losses: Mapping[int, Mapping[int, float]], draw: Draw, correct: bool = True
) -> dict[int, list[float]]:
    """The losses of one resample ({rung: {seed: loss}} in `losses`, the runs drawn for each
    rung in `draw`): a rung's are its mean plus each drawn run's deviation from its own rung's
    mean, times `√(n / (n − 1))` with `correct` (n that rung's seeds). A plain resample's mean
    varies by `(n − 1) / n` of the seeds' sample variance over n, half of it at 2 seeds; the
    factor restores the whole (the usual adjustment of resampled residuals: Davison and
    Hinkley 1997, "Bootstrap methods and their application")."""
    mean = {r: math.fsum(ls.values()) / len(ls) for r, ls in losses.items()}
    out = {}
    for r, drawn in draw.items():
        values = []
        for src, s in drawn:
            n = len(losses[src])
            scale = math.sqrt(n / (n - 1)) if correct and n > 1 else 1.0
            values.append(mean[r] + scale * (losses[src][s] - mean[src]))
        out[r] = values
    return out


def _arrays(runs: Runs, skip: int | None = None) -> tuple[list[float], list[float]]:
    ps = [p for r in sorted(runs) if r != skip for _, p in sorted(runs[r].items())]
    return [p.flops for p in ps], [p.loss for p in ps]


def _refit(runs: Runs, draw: Draw, start: PowerLaw, correct: bool) -> PowerLaw | None:
    losses = resampled_losses({r: {s: p.loss for s, p in runs[r].items()} for r in runs}, draw,
                              correct)  # fmt: skip
    flops = [next(iter(runs[r].values())).flops for r in sorted(runs) for _ in losses[r]]
    try:
        return fit_power_law(flops, [x for r in sorted(runs) for x in losses[r]], start=start)
    except FitError:
        return None


def _estimate(value: float, values: list[float], confidence: float, total: int,
              interval: bool) -> Estimate:  # fmt: skip
    if not interval or not values:
        return Estimate(value, confidence=confidence, resamples=len(values),
                        failed=total - len(values))  # fmt: skip
    low, high = percentile_interval(values, confidence)
    return Estimate(value, low, high, confidence, len(values), total - len(values))


def _held_out(variant: str, runs: Runs, top: int) -> HeldOut | None:
    if len(runs) < HELD_OUT_RUNGS:
        return None
    try:
        law = fit_power_law(*_arrays(runs, skip=top))
    except FitError as e:
        raise FitError(f"variant {variant!r} without rung {top}: {e}") from None
    flops = next(iter(runs[top].values())).flops
    losses = [p.loss for p in runs[top].values()]
    observed = math.fsum(losses) / len(losses)
    spread = float(np.std(losses, ddof=1)) if len(losses) > 1 else None
    return HeldOut(top, flops, observed, law.predict(flops), law, spread)


def _chinchilla(runs: Runs) -> Chinchilla | None:
    ps = [p for r in runs.values() for p in r.values()]
    n, d = np.array([p.params for p in ps], float), np.array([p.tokens for p in ps], float)
    if chinchilla_problem(n, d) is not None:
        return None
    return fit_chinchilla(n, d, [p.loss for p in ps])


def fit_ladder(
    points: Sequence[Point],
    *,
    baseline: str,
    target_flops: float | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    resampling: str = "pooled",
    correct: bool = True,
) -> LadderFit:
    """Each variant's law, its bootstrap over seeds, its multiplier over `baseline` at
    `target_flops` (None: the baseline's largest rung) and its held-out largest rung (module
    docstring). `FitError` naming the variant, rung and seed for too few rungs, a variant
    without the baseline's rungs or seeds, a non-finite or non-positive loss or compute."""
    if not points:
        raise FitError("no points to fit: a ladder needs its runs' final losses")
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, int) or bootstrap < 0:
        raise FitError(f"bootstrap {bootstrap!r}: expected a whole number of resamples ≥ 0")
    if resampling not in RESAMPLING:
        raise FitError(f"resampling {resampling!r}{did_you_mean(resampling, RESAMPLING)}: "
                       f"expected {' or '.join(RESAMPLING)}")  # fmt: skip
    if not 0 < confidence < 1:
        raise FitError(f"confidence {confidence!r}: expected a level between 0 and 1, e.g. 0.95")
    ladder = _by_variant(points)
    _check_ladder(ladder, baseline)
    base = ladder[baseline]
    top = max(base, key=lambda r: next(iter(base[r].values())).flops)
    if target_flops is None:
        target_flops = next(iter(base[top].values())).flops
    elif not math.isfinite(target_flops) or target_flops <= 0:
        raise FitError(f"target compute {target_flops!r}: expected a finite, positive FLOPs count")
    names = [baseline, *(v for v in dict.fromkeys(p.variant for p in points) if v != baseline)]

    laws: dict[str, PowerLaw] = {}
    for v in names:
        try:
            laws[v] = fit_power_law(*_arrays(ladder[v]))
        except FitError as e:
            raise FitError(f"variant {v!r}: {e}") from None
    draws = resamples({r: sorted(s) for r, s in base.items()}, bootstrap, seed, resampling)
    interval = any(len(s) > 1 for s in base.values())  # one seed a rung: every resample alike
    refits = {v: [_refit(ladder[v], d, laws[v], correct) for d in draws] if interval else []
              for v in names}  # fmt: skip

    out = []
    for v in names:
        law, reps = laws[v], refits[v]
        both = [(r, b) for r, b in zip(reps, refits[baseline], strict=True)
                if r is not None and b is not None]  # fmt: skip
        out.append(VariantFit(
            variant=v,
            points=tuple(p for r in sorted(ladder[v]) for _, p in sorted(ladder[v][r].items())),
            law=law,
            alpha=_estimate(law.alpha, [r.alpha for r in reps if r is not None], confidence,
                            len(reps), interval),
            loss_at_target=_estimate(law.predict(target_flops),
                                     [r.predict(target_flops) for r in reps if r is not None],
                                     confidence, len(reps), interval),
            multiplier=_estimate(multiplier(law, laws[baseline], target_flops),
                                 [multiplier(r, b, target_flops) for r, b in both],
                                 confidence, len(reps), interval and v != baseline),
            held_out=_held_out(v, ladder[v], top),
            chinchilla=_chinchilla(ladder[v]),
            replicates=tuple(reps),
        ))  # fmt: skip
    return LadderFit(baseline, float(target_flops), bootstrap, seed, confidence, tuple(out),
                     resampling if interval and bootstrap else None, correct)  # fmt: skip


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class LadderFit:
    """Every variant's fits, the baseline first."""

    baseline: str
    target_flops: float
    bootstrap: int
    seed: int
    confidence: float
    variants: tuple[VariantFit, ...]
    resampling: str | None = "pooled"  # None: no intervals
    correct: bool = True

    def variant(self, name: str) -> VariantFit:
        for v in self.variants:
            if v.variant == name:
                return v
        names = [v.variant for v in self.variants]
        raise FitError(f"no variant {name!r}{did_you_mean(name, names)}; the variants are: "
                       f"{one_of(names)}")  # fmt: skip

    def ranked(self, sort: str | None = None) -> list[VariantFit]:
        """The variants in the ladder's order (None), by multiplier (largest first) or by the
        loss at the target compute (lowest first)."""
        if sort is None:
            return list(self.variants)
        if sort not in SORT_KEYS:
            raise FitError(
                f"--sort {sort!r}{did_you_mean(sort, SORT_KEYS)}: a ladder's table sorts by "
                f"{' or '.join(SORT_KEYS)}"
            )
        if sort == "multiplier":
            return sorted(self.variants, key=lambda v: -v.multiplier.value)
        return sorted(self.variants, key=lambda v: v.loss_at_target.value)

    def table(self, sort: str | None = None) -> str:
        """The fits as a Markdown table, with the lines that say what its columns are."""
        pct = f"{self.confidence:.0%}"
        head = ["variant", "E", "A", f"α [{pct}]", f"loss at C* [{pct}]",
                f"multiplier [{pct}]", "held-out rung: predicted / observed (error)"]  # fmt: skip
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join([" --- "] + [" ---: "] * 6) + "|"]
        for v in self.ranked(sort):
            h = v.held_out
            held = ("– (needs 4 rungs)" if h is None else
                    f"rung {h.rung}: {h.predicted:.3f} / {h.observed:.3f} "
                    f"({h.error:+.3f}, {h.relative:+.1%}"
                    f"{'' if h.spread is None else f'; seeds ±{h.spread:.3f}'})")  # fmt: skip
            mult = ("1 (baseline)" if v.variant == self.baseline
                    else _with_interval(v.multiplier, "{:.3g}×"))  # fmt: skip
            lines.append("| " + " | ".join([
                f"`{v.variant}`", f"{v.law.E:.3f}", f"{v.law.A:.3g}",
                _with_interval(v.alpha, "{:.3f}"), _with_interval(v.loss_at_target, "{:.3f}"),
                mult, held]) + " |")  # fmt: skip
        note = (f"L(C) = E + A·C^−α per variant, C in FLOPs; C* = {self.target_flops:.3g} FLOPs. "
                "Multiplier: the compute the baseline needs to reach the variant's loss at C*, "
                "over C* (> 1: the variant is worth more compute). ")  # fmt: skip
        if self.resampling is not None:
            how = ("each rung's seeds' deviations from their mean, pooled over the rungs"
                   if self.resampling == "pooled" else "the seeds within each rung")  # fmt: skip
            note += (f"Intervals: {pct} percentile bootstrap, {self.bootstrap} resamples of "
                     f"{how}{', scaled by √(n/(n−1))' if self.correct else ''} (paired across "
                     f"variants; seed {self.seed}).")  # fmt: skip
        else:
            note += "No intervals: they need 2 or more seeds a rung and --bootstrap N."
        note += (" Held-out: the law fitted without the largest rung predicts its mean loss; "
                 "error = predicted − observed; ± the seeds' standard deviation "
                 "there.")  # fmt: skip
        failed = [f"`{v.variant}` {v.multiplier.failed}" for v in self.variants
                  if v.multiplier.failed]  # fmt: skip
        if failed:
            note += (f" Resamples that did not fit (left out of the intervals): "
                     f"{', '.join(failed)} of {self.bootstrap}.")  # fmt: skip
        chin = [v for v in self.variants if v.chinchilla is not None]
        extra = "".join(
            f"\n- `{v.variant}`: L(N, D) = {c.E:.3f} + {c.A:.3g}/N^{c.alpha:.3f} + "
            f"{c.B:.3g}/D^{c.beta:.3f}" for v in chin if (c := v.chinchilla) is not None
        )  # fmt: skip
        if extra:
            extra = "\n\nChinchilla's L(N, D), the ladder varying N and D:" + extra
        return "\n".join(lines) + f"\n\n{note}{extra}\n"

    def to_json(self, sort: str | None = None) -> dict[str, Any]:
        return {"baseline": self.baseline, "target_flops": self.target_flops,
                "bootstrap": self.bootstrap, "seed": self.seed, "confidence": self.confidence,
                "resampling": self.resampling, "correct": self.correct,
                "variants": [v.to_json() for v in self.ranked(sort)]}  # fmt: skip


def _with_interval(e: Estimate, fmt: str) -> str:
    text = fmt.format(e.value) if math.isfinite(e.value) else "∞"
    if e.low is not None and e.high is not None:
        lo = fmt.format(e.low) if math.isfinite(e.low) else "∞"
        hi = fmt.format(e.high) if math.isfinite(e.high) else "∞"
        text += f" [{lo}, {hi}]"
    return text
