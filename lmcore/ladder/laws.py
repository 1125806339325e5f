"""Scaling laws of final loss, fitted to a ladder's runs with scipy.

    law = fit_power_law(flops, losses)              # L(C) = E + A·C^−α
    law.predict(1e17), law.inverse(3.2)             # the loss at C; the compute that reaches L
    ch = fit_chinchilla(params, tokens, losses)     # L(N, D) = E + A/N^α + B/D^β

Both are fitted as Hoffmann et al. (2022, "Training compute-optimal large language models",
appendix D.2) fit theirs: in log-loss, the model's `log L̂` written as a log-sum-exp of its
terms (`log L̂ = LSE(a − α·log C, e)`, `A = exp(a)`, `E = exp(e)`, so every term stays
positive without a constraint), the residuals `log L̂ − log L` weighed by a Huber loss of
δ = 1e-3 (quadratic below δ, linear above: a diverged or unlucky run pulls the fit little), from
a grid of starts, keeping the best. The minimiser is `scipy.optimize.least_squares` (the
trust-region reflective method, the one that takes both a robust loss and bounds, with the
residuals' Jacobian in closed form); its `loss="huber", f_scale=δ` is exactly
`Σ scipy.special.huber(δ, r)`. log C (and log N, log D) are centred on their mean before
fitting, so the starts and the scale of `a` do not depend on the units of compute. The
exponents are bounded to [0, 10] (a law whose loss grows with compute is no scaling law).

scipy is imported inside the fits, so importing this module costs nothing.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, overload

import numpy as np

from lmcore.errors import FitError

if TYPE_CHECKING:
    from numpy.typing import NDArray

HUBER_DELTA: Final = 1e-3  # Hoffmann et al.'s δ, in log-loss
MAX_EXPONENT: Final = 10.0
POWER_LAW_PARAMETERS: Final = 3  # E, A, α
CHINCHILLA_PARAMETERS: Final = 5  # E, A, α, B, β
# The grid of starts: exponents, and the irreducible loss as a fraction of the lowest loss.
_ALPHAS: Final = (0.1, 0.3, 0.7)
_E_FRACTIONS: Final = (1e-3, 0.5, 0.9)
_CH_EXPONENTS: Final = (0.1, 0.3, 0.6)
_CH_E_FRACTIONS: Final = (1e-3, 0.4, 0.8)


@dataclass(frozen=True)
class PowerLaw:
    """`L(C) = E + A·C^−α`, loss in nats per token against training compute C in FLOPs.
    `cost` is the fit's Huber objective, `points` how many losses it was fitted to."""

    E: float
    A: float
    alpha: float
    points: int = 0
    cost: float = math.nan

    @overload
    def predict(self, flops: float) -> float: ...
    @overload
    def predict(self, flops: NDArray[np.float64]) -> NDArray[np.float64]: ...
    def predict(self, flops: Any) -> Any:
        """The loss at compute `flops` (a number or an array)."""
        c = np.asarray(flops, dtype=np.float64)
        out = self.E + np.exp(math.log(self.A) - self.alpha * np.log(c))
        return float(out) if out.ndim == 0 else out

    def inverse(self, loss: float) -> float:
        """The compute at which the law reaches `loss`: `C = ((L − E) / A)^(−1/α)`. `FitError`
        for a loss at or below E, which no compute reaches."""
        if not math.isfinite(loss):
            raise FitError(f"loss {loss} is not finite: no compute reaches it")
        if loss <= self.E:
            raise FitError(
                f"loss {loss:.6g} is at or below this law's irreducible loss E = {self.E:.6g}: "
                "no compute reaches it"
            )
        if self.alpha <= 0:
            raise FitError(f"this law is flat (α = {self.alpha:.3g}): compute does not lower it")
        return math.exp((math.log(self.A) - math.log(loss - self.E)) / self.alpha)

    def to_json(self) -> dict[str, float | int | None]:
        return {"E": _finite(self.E), "A": _finite(self.A), "alpha": _finite(self.alpha),
                "points": self.points}  # fmt: skip


@dataclass(frozen=True)
class Chinchilla:
    """`L(N, D) = E + A/N^α + B/D^β`: N non-embedding parameters, D training tokens."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    points: int = 0
    cost: float = math.nan

    def predict(self, params: Any, tokens: Any) -> Any:
        """The loss at `params` and `tokens` (numbers or arrays of one shape)."""
        n = np.log(np.asarray(params, dtype=np.float64))
        d = np.log(np.asarray(tokens, dtype=np.float64))
        out = (self.E + np.exp(math.log(self.A) - self.alpha * n)
               + np.exp(math.log(self.B) - self.beta * d))  # fmt: skip
        return float(out) if out.ndim == 0 else out

    def to_json(self) -> dict[str, float | int | None]:
        return {"E": _finite(self.E), "A": _finite(self.A), "alpha": _finite(self.alpha),
                "B": _finite(self.B), "beta": _finite(self.beta),
                "points": self.points}  # fmt: skip


def _finite(x: float) -> float | None:
    """JSON has no infinity or NaN: such a value is written as null."""
    return x if math.isfinite(x) else None


def _values(name: str, values: Sequence[float] | NDArray[Any], n: int | None) -> NDArray[Any]:
    """`values` as a float array, each finite and positive; `FitError` naming the first that is
    not (by its index)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise FitError(f"{name}: expected a flat sequence of numbers, got shape {arr.shape}")
    if n is not None and len(arr) != n:
        raise FitError(f"{name}: {len(arr)} values against {n}: every point needs each value")
    bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
    if bad.size:
        i = int(bad[0])
        raise FitError(
            f"{name}[{i}] = {arr[i]}: a scaling law needs finite, positive values "
            f"({bad.size} of {len(arr)} are not)"
        )
    return arr


def _huber_fit(
    residuals: Any, jacobian: Any, starts: Sequence[NDArray[Any]], bounds: tuple[Any, Any],
    delta: float,
) -> tuple[NDArray[Any], float]:  # fmt: skip
    """The best of `least_squares` from each start: its parameters and its cost."""
    from scipy.optimize import least_squares

    def solve(x0: NDArray[Any], tol: float) -> tuple[NDArray[Any], float] | None:
        with np.errstate(all="ignore"):
            r = least_squares(residuals, np.clip(x0, *bounds), jac=jacobian, bounds=bounds,
                              loss="huber", f_scale=delta, method="trf", x_scale="jac",
                              xtol=tol, ftol=tol, gtol=tol, max_nfev=1000)  # fmt: skip
        ok = np.all(np.isfinite(r.x)) and math.isfinite(r.cost)
        return (r.x, float(r.cost)) if ok else None

    # Every start to a loose tolerance, then the best of them polished: the same minimum as
    # polishing each, at a fraction of the evaluations.
    found = [f for f in (solve(x0, 1e-6) for x0 in starts) if f is not None]
    if not found:
        raise FitError("no start of the fit converged to finite parameters")
    best = min(found, key=lambda f: f[1])
    polished = solve(best[0], 1e-12)
    return polished if polished is not None and polished[1] <= best[1] else best


def _softmax_terms(logs: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
    """log Σ exp(logs) over the first axis, and each term's share of the sum."""
    top = logs.max(axis=0)
    total = top + np.log(np.exp(logs - top).sum(axis=0))
    return total, np.exp(logs - total)


def fit_power_law(
    flops: Sequence[float] | NDArray[Any],
    losses: Sequence[float] | NDArray[Any],
    *,
    delta: float = HUBER_DELTA,
    start: PowerLaw | None = None,
) -> PowerLaw:
    """`L(C) = E + A·C^−α` fitted to the losses at compute `flops` (one point each; several
    seeds of a rung are several points at one compute). From the module's grid of starts, or
    from `start` alone (a bootstrap's refit starts from the full fit) with the grid as the
    fallback. `FitError` below 3 distinct compute values, or for a non-finite or non-positive
    value."""
    c = _values("flops", flops, None)
    y: NDArray[Any] = np.log(_values("losses", losses, len(c)))
    distinct = np.unique(c)
    if len(distinct) < POWER_LAW_PARAMETERS:
        shown = ", ".join(f"{v:.3g}" for v in distinct)
        raise FitError(
            f"a saturating power law L = E + A·C^−α has {POWER_LAW_PARAMETERS} parameters: it "
            f"needs losses at {POWER_LAW_PARAMETERS} or more distinct compute values, got "
            f"{len(distinct)} ({shown})"
        )
    x0 = float(np.log(c).mean())
    x = np.log(c) - x0

    def residuals(p: NDArray[Any]) -> NDArray[Any]:
        a, alpha, e = p
        out: NDArray[Any] = _softmax_terms(np.stack([a - alpha * x, np.full_like(x, e)]))[0] - y
        return out

    def jacobian(p: NDArray[Any]) -> NDArray[Any]:
        a, alpha, e = p
        _, share = _softmax_terms(np.stack([a - alpha * x, np.full_like(x, e)]))
        return np.stack([share[0], -x * share[0], share[1]], axis=1)

    bounds = (np.array([-np.inf, 0.0, -np.inf]), np.array([np.inf, MAX_EXPONENT, np.inf]))
    lo, mean = float(np.exp(y).min()), float(np.exp(y).mean())
    starts = [np.array([math.log(max(mean - f * lo, 1e-9 * mean)), alpha, math.log(f * lo)])
              for alpha in _ALPHAS for f in _E_FRACTIONS]  # fmt: skip
    if start is not None:
        # A full fit's E (or A) may have underflowed to 0.0 (its log below −745): start from
        # the smallest positive float's log instead of failing on log(0).
        tiny = sys.float_info.min
        first = np.array([math.log(max(start.A, tiny)) - start.alpha * x0, start.alpha,
                          math.log(max(start.E, tiny))])  # fmt: skip
        try:
            (a, alpha, e), cost = _huber_fit(residuals, jacobian, [first], bounds, delta)
        except FitError:
            (a, alpha, e), cost = _huber_fit(residuals, jacobian, starts, bounds, delta)
    else:
        (a, alpha, e), cost = _huber_fit(residuals, jacobian, starts, bounds, delta)
    return PowerLaw(E=math.exp(e), A=math.exp(a + alpha * x0), alpha=float(alpha),
                    points=len(c), cost=cost)  # fmt: skip


def chinchilla_problem(params: NDArray[Any], tokens: NDArray[Any]) -> str | None:
    """Why `L(N, D)` cannot be fitted to these (N, D) points, or None: it needs
    `CHINCHILLA_PARAMETERS` distinct points, 3 distinct N and 3 distinct D, and D not a power
    law of N (log D an affine function of log N, as in a ladder at a fixed tokens-per-parameter
    ratio: then A/N^α and B/D^β are one term and their split is arbitrary)."""
    pairs = {(float(n), float(d)) for n, d in zip(params, tokens, strict=True)}
    ns, ds = {n for n, _ in pairs}, {d for _, d in pairs}
    if len(pairs) < CHINCHILLA_PARAMETERS or len(ns) < 3 or len(ds) < 3:
        return (
            f"L(N, D) = E + A/N^α + B/D^β has {CHINCHILLA_PARAMETERS} parameters: it needs "
            f"{CHINCHILLA_PARAMETERS} or more distinct (N, D) points with 3 or more distinct N "
            f"and 3 or more distinct D, got {len(pairs)} points, {len(ns)} distinct N and "
            f"{len(ds)} distinct D"
        )
    m = np.array([[1.0, math.log(n), math.log(d)] for n, d in sorted(pairs)])
    m[:, 1:] -= m[:, 1:].mean(axis=0)
    s = np.linalg.svd(m, compute_uv=False)
    if s[-1] <= 1e-6 * s[0]:
        return (
            "the ladder does not vary N and D independently (log D is a linear function of "
            "log N on every point, e.g. a fixed tokens-per-parameter ratio), so A/N^α and B/D^β "
            "cannot be told apart: fit the loss in compute (fit_power_law), or add runs at "
            "other token counts"
        )
    return None


def fit_chinchilla(
    params: Sequence[float] | NDArray[Any],
    tokens: Sequence[float] | NDArray[Any],
    losses: Sequence[float] | NDArray[Any],
    *,
    delta: float = HUBER_DELTA,
) -> Chinchilla:
    """`L(N, D) = E + A/N^α + B/D^β` fitted to the losses at `params` (N) and `tokens` (D).
    `FitError` when the points cannot tell the terms apart (`chinchilla_problem`), or for a
    non-finite or non-positive value."""
    n_ = _values("params", params, None)
    d_ = _values("tokens", tokens, len(n_))
    y: NDArray[Any] = np.log(_values("losses", losses, len(n_)))
    problem = chinchilla_problem(n_, d_)
    if problem is not None:
        raise FitError(problem)
    xn, xd = float(np.log(n_).mean()), float(np.log(d_).mean())
    u, v = np.log(n_) - xn, np.log(d_) - xd

    def terms(p: NDArray[Any]) -> NDArray[Any]:
        a, alpha, b, beta, e = p
        return np.stack([a - alpha * u, b - beta * v, np.full_like(u, e)])

    def residuals(p: NDArray[Any]) -> NDArray[Any]:
        out: NDArray[Any] = _softmax_terms(terms(p))[0] - y
        return out

    def jacobian(p: NDArray[Any]) -> NDArray[Any]:
        _, w = _softmax_terms(terms(p))
        return np.stack([w[0], -u * w[0], w[1], -v * w[1], w[2]], axis=1)

    inf = np.inf
    bounds = (np.array([-inf, 0.0, -inf, 0.0, -inf]),
              np.array([inf, MAX_EXPONENT, inf, MAX_EXPONENT, inf]))  # fmt: skip
    lo, mean = float(np.exp(y).min()), float(np.exp(y).mean())
    starts = []
    for f in _CH_E_FRACTIONS:
        half = math.log(max(mean - f * lo, 1e-9 * mean) / 2)
        for alpha in _CH_EXPONENTS:
            for beta in _CH_EXPONENTS:
                starts.append(np.array([half, alpha, half, beta, math.log(f * lo)]))
    (a, alpha, b, beta, e), cost = _huber_fit(residuals, jacobian, starts, bounds, delta)
    return Chinchilla(E=math.exp(e), A=math.exp(a + alpha * xn), alpha=float(alpha),
                      B=math.exp(b + beta * xd), beta=float(beta), points=len(n_),
                      cost=cost)  # fmt: skip
