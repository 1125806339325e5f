"""The scaling laws' fits against their known parameters and independent scipy fits: synthetic
losses from a known law with small noise are recovered within a stated tolerance, and the
Huber objective's minimum is the one scipy.optimize.minimize finds on the same objective."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmcore.errors import FitError
from lmcore.ladder.laws import HUBER_DELTA, Chinchilla, PowerLaw, fit_chinchilla, fit_power_law
from tests.helpers.errors import raises_naming

optimize = pytest.importorskip("scipy.optimize", reason="needs scipy (a dependency of lmcore)")
special = pytest.importorskip("scipy.special", reason="needs scipy (a dependency of lmcore)")

# A law with a compute range like a CPU ladder's: 6 rungs over 4 decades, 3 seeds each.
E, A, ALPHA = 1.8, 2.0e3, 0.3
COMPUTE = np.repeat(np.geomspace(1e12, 1e16, 6), 3)
NOISE = 1e-3  # relative: about a seed's spread at these losses


def noisy(clean: np.ndarray, seed: int = 0, noise: float = NOISE) -> np.ndarray:
    return clean * np.exp(np.random.default_rng(seed).normal(0.0, noise, clean.shape))


def power_law(c: np.ndarray, e: float = E, a: float = A, alpha: float = ALPHA) -> np.ndarray:
    return e + a * c**-alpha


def test_a_noiseless_power_law_is_recovered_exactly() -> None:
    law = fit_power_law(COMPUTE, power_law(COMPUTE))
    assert (law.E, law.A, law.alpha) == (pytest.approx(E, rel=1e-6), pytest.approx(A, rel=1e-5),
                                         pytest.approx(ALPHA, rel=1e-6))  # fmt: skip
    assert law.points == len(COMPUTE)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_noisy_power_law_is_recovered_within_tolerance(seed: int) -> None:
    # 0.1 % noise on losses whose reducible part is 0.5-0.03 nats: α to ±0.01, E to ±0.005.
    law = fit_power_law(COMPUTE, noisy(power_law(COMPUTE), seed))
    assert abs(law.alpha - ALPHA) < 0.01 and abs(law.E - E) < 0.005
    assert law.predict(1e14) == pytest.approx(power_law(np.array(1e14)), rel=2e-3)


def test_the_fit_is_the_minimum_of_the_huber_objective_scipy_minimize_finds() -> None:
    """The same objective (Hoffmann et al.'s: Huber of log-loss residuals, δ = 1e-3, the model
    as a log-sum-exp) minimised by L-BFGS-B from its own grid of starts, as their paper does,
    reaches the same parameters and no lower cost."""
    losses = noisy(power_law(COMPUTE), 3)
    x, y = np.log(COMPUTE), np.log(losses)

    def objective(p: np.ndarray) -> float:
        a, alpha, e = p
        pred = special.logsumexp(np.stack([a - alpha * x, np.full_like(x, e)]), axis=0)
        return float(special.huber(HUBER_DELTA, pred - y).sum())

    best = min((optimize.minimize(objective, [a0, al0, e0], method="L-BFGS-B",
                                  options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 20000})
                for a0 in (5.0, 10.0) for al0 in (0.2, 0.5) for e0 in (0.0, 0.5)),
               key=lambda r: r.fun)  # fmt: skip
    law = fit_power_law(COMPUTE, losses)
    assert law.cost == pytest.approx(objective(np.array([math.log(law.A), law.alpha,
                                                         math.log(law.E)])), rel=1e-9)  # fmt: skip
    assert law.cost <= best.fun * (1 + 1e-6)
    _, alpha, e = best.x
    assert law.alpha == pytest.approx(alpha, abs=1e-3)
    assert abs(law.E - math.exp(e)) < 1e-3


def test_the_fit_agrees_with_curve_fit_on_the_same_points() -> None:
    """scipy.optimize.curve_fit (plain least squares in loss, another objective) on the same
    noisy points lands within the noise of the Huber fit."""
    losses = noisy(power_law(COMPUTE), 4)
    (e, a, alpha), _ = optimize.curve_fit(lambda c, e, a, al: e + a * c**-al, COMPUTE, losses,
                                          p0=(1.5, 1e3, 0.25), maxfev=20000)  # fmt: skip
    law = fit_power_law(COMPUTE, losses)
    assert law.alpha == pytest.approx(alpha, abs=0.01)
    assert abs(law.E - e) < 0.005
    assert law.predict(COMPUTE) == pytest.approx(e + a * COMPUTE**-alpha, rel=5e-4)


def test_inverse_undoes_predict_and_refuses_a_loss_at_or_below_e() -> None:
    law = PowerLaw(E=1.8, A=2e3, alpha=0.3)
    for c in (1e10, 3.3e14, 1e20):
        assert law.inverse(law.predict(c)) == pytest.approx(c, rel=1e-9)
    # by hand: (L - E) / A = C^-α, so C = ((2.0 - 1.8) / 2000)^(-1/0.3)
    assert law.inverse(2.0) == pytest.approx((0.2 / 2e3) ** (-1 / 0.3), rel=1e-12)
    assert law.predict(np.array([1e12, 1e13])).shape == (2,)
    with raises_naming(FitError, "loss 1.8", "irreducible loss E = 1.8", "no compute reaches it"):
        law.inverse(1.8)
    with raises_naming(FitError, "loss 1.5"):
        law.inverse(1.5)
    with raises_naming(FitError, "loss nan", "not finite"):
        law.inverse(math.nan)


def test_too_few_compute_values_and_bad_values_are_refused_by_name() -> None:
    with raises_naming(FitError, "3 parameters", "3 or more distinct compute values", "got 2",
                       "1e+12, 1e+13"):  # fmt: skip
        fit_power_law([1e12, 1e12, 1e13], [3.0, 3.1, 2.9])
    with raises_naming(FitError, "losses[1] = nan", "finite, positive"):
        fit_power_law([1e12, 1e13, 1e14], [3.0, math.nan, 2.9])
    with raises_naming(FitError, "flops[0] = -1.0", "finite, positive"):
        fit_power_law([-1.0, 1e13, 1e14], [3.0, 3.0, 2.9])
    with raises_naming(FitError, "losses[2] = 0.0"):
        fit_power_law([1e12, 1e13, 1e14], [3.0, 3.0, 0.0])
    with raises_naming(FitError, "losses: 2 values against 3"):
        fit_power_law([1e12, 1e13, 1e14], [3.0, 3.0])


# Chinchilla's own fit (Hoffmann et al. 2022, approach 3) as the truth, on a 4 × 4 grid of N, D.
CH = {"E": 1.69, "A": 406.4, "alpha": 0.34, "B": 410.7, "beta": 0.28}
N, D = (g.ravel() for g in np.meshgrid(np.geomspace(1e6, 3e8, 4), np.geomspace(1e8, 3e10, 4)))


def chinchilla(n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return CH["E"] + CH["A"] / n ** CH["alpha"] + CH["B"] / d ** CH["beta"]


def test_chinchillas_law_is_recovered() -> None:
    exact = fit_chinchilla(N, D, chinchilla(N, D))
    for k, v in CH.items():
        assert getattr(exact, k) == pytest.approx(v, rel=1e-5), k
    # 0.1 % noise: the exponents to ±0.01, E to ±0.03
    law = fit_chinchilla(N, D, noisy(chinchilla(N, D), 5))
    assert abs(law.alpha - CH["alpha"]) < 0.01 and abs(law.beta - CH["beta"]) < 0.01
    assert abs(law.E - CH["E"]) < 0.03
    assert law.predict(1e7, 1e9) == pytest.approx(
        chinchilla(np.array(1e7), np.array(1e9)), rel=2e-3
    )


def test_chinchilla_agrees_with_curve_fit_on_the_same_points() -> None:
    losses = noisy(chinchilla(N, D), 6)
    p, _ = optimize.curve_fit(lambda nd, e, a, al, b, be: e + a / nd[0] ** al + b / nd[1] ** be,
                              np.stack([N, D]), losses, p0=(1.5, 300, 0.3, 300, 0.3),
                              maxfev=50000)  # fmt: skip
    law = fit_chinchilla(N, D, losses)
    assert law.predict(N, D) == pytest.approx(Chinchilla(*p).predict(N, D), rel=1e-3)
    assert law.alpha == pytest.approx(p[2], abs=0.03) and law.beta == pytest.approx(p[4], abs=0.03)


def test_chinchilla_refuses_a_ladder_that_does_not_vary_n_and_d_apart() -> None:
    n = np.geomspace(1e6, 1e8, 6)
    with raises_naming(FitError, "does not vary N and D independently", "tokens-per-parameter",
                       "fit_power_law"):  # fmt: skip
        fit_chinchilla(n, 20 * n, chinchilla(n, 20 * n))
    with raises_naming(FitError, "5 parameters", "got 4 points", "2 distinct N"):
        fit_chinchilla([1e6, 1e6, 1e7, 1e7], [1e8, 1e9, 1e8, 1e10], [3.0, 2.9, 2.8, 2.7])


def test_a_start_whose_E_underflowed_to_zero_still_refits() -> None:
    # A pure power law (E = 0): its full fit's E is exp(e) with e far below −745, i.e. 0.0; a
    # bootstrap refit from it must not take log(0).
    c = np.array([1e10, 3e10, 1e11, 3e11, 1e12])
    losses = 70.0 * c**-0.1
    law = fit_power_law(c, losses, start=PowerLaw(E=0.0, A=70.0, alpha=0.1))
    assert law.predict(3e12) == pytest.approx(70.0 * 3e12**-0.1, rel=1e-3)
