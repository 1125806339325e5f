"""A ladder's fits: the multiplier against its closed form, the bootstrap interval and the
held-out rung against hand computations, the table and the errors."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest

from lmcore.errors import FitError
from lmcore.ladder.fits import (
    Point,
    PowerLaw,
    fit_ladder,
    fit_power_law,
    multiplier,
    percentile_interval,
    resampled_losses,
    resamples,
)
from tests.helpers.errors import raises_naming

pytest.importorskip("scipy.optimize", reason="needs scipy (a dependency of lmcore)")

E, A, ALPHA = 1.8, 2.0e3, 0.3
RUNG_FLOPS = (1e12, 1e13, 1e14, 1e15)


def law(c: float, k: float = 1.0) -> float:
    """The baseline's law at k·C: a variant worth k× the compute."""
    return E + A * (k * c) ** -ALPHA


def ladder(variants: dict[str, Callable[[float], float]], rungs: tuple[float, ...] = RUNG_FLOPS,
           seeds: int = 2, noise: float = 0.0, rng: int = 0) -> list[Point]:  # fmt: skip
    g = np.random.default_rng(rng)
    return [Point(v, s, r, params=int(c // 6e8) + 1, tokens=int(1e8), flops=c,
                  loss=f(c) * math.exp(g.normal(0, noise)) if noise else f(c))
            for v, f in variants.items() for r, c in enumerate(rungs)
            for s in range(seeds)]  # fmt: skip


def test_the_multiplier_is_k_when_the_variants_law_is_the_baseline_at_k_times_the_compute() -> None:
    base = PowerLaw(E, A, ALPHA)
    for k in (0.5, 1.0, 1.37, 4.0):
        # L(kC) = E + A·k^-α·C^-α: the same law with A scaled by k^-α
        assert multiplier(PowerLaw(E, A * k**-ALPHA, ALPHA), base, 3e14) == pytest.approx(
            k, rel=1e-12
        )
    # a variant below the baseline's E: no baseline compute reaches it
    assert multiplier(PowerLaw(E - 0.1, A, ALPHA), base, 1e15) == math.inf
    fit = fit_ladder(ladder({"base": law, "x": lambda c: law(c, 1.5), "y": lambda c: law(c, 0.8)}),
                     baseline="base", bootstrap=0)  # fmt: skip
    assert fit.variant("x").multiplier.value == pytest.approx(1.5, rel=1e-4)
    assert fit.variant("y").multiplier.value == pytest.approx(0.8, rel=1e-4)
    assert fit.variant("base").multiplier.value == pytest.approx(1.0, rel=1e-9)
    assert fit.target_flops == RUNG_FLOPS[-1]
    at = fit_ladder(ladder({"base": law, "x": lambda c: law(c, 1.5)}), baseline="base",
                    bootstrap=0, target_flops=1e17)  # fmt: skip
    assert at.variant("x").multiplier.value == pytest.approx(1.5, rel=1e-3)  # the same law: any C*


def test_percentile_interval_takes_order_statistics_as_numpy_lower_and_higher() -> None:
    values = list(np.random.default_rng(0).permutation(100).astype(float))
    assert percentile_interval(values, 0.95) == (2.0, 97.0)  # ⌊0.025·99⌋, ⌈0.975·99⌉
    for n, conf in ((200, 0.95), (37, 0.9), (1000, 0.5)):
        v = np.random.default_rng(n).normal(size=n)
        q = (1 - conf) / 2
        assert percentile_interval(v, conf) == (np.quantile(v, q, method="lower"),
                                                np.quantile(v, 1 - q, method="higher"))  # fmt: skip
    assert percentile_interval([1.0, 2.0, math.inf], 0.5) == (1.0, math.inf)
    with raises_naming(FitError, "no bootstrap resample"):
        percentile_interval([], 0.95)


def test_resamples_draw_with_replacement_from_the_seeded_generator() -> None:
    seeds = {0: [3, 5], 1: [3, 5, 7], 2: [4]}
    rung = resamples(seeds, 50, seed=11, scheme="rung")
    rng = np.random.default_rng(11)  # the documented order: resample by resample, rung by rung
    for d in rung:
        assert d[0] == tuple((0, [3, 5][i]) for i in rng.integers(0, 2, size=2))
        assert d[1] == tuple((1, [3, 5, 7][i]) for i in rng.integers(0, 3, size=3))
        assert d[2] == tuple((2, 4) for _ in rng.integers(0, 1, size=1))
    pooled = resamples(seeds, 50, seed=11)
    pool = [(0, 3), (0, 5), (1, 3), (1, 5), (1, 7)]  # rung 2's one seed has no deviation to lend
    rng = np.random.default_rng(11)
    for d in pooled:
        for r, n in ((0, 2), (1, 3), (2, 1)):
            assert d[r] == tuple(pool[i] for i in rng.integers(0, 5, size=n))
    assert resamples(seeds, 50, seed=11) == pooled
    with raises_naming(FitError, "resampling 'pool'", "did you mean 'pooled'", "pooled or rung"):
        resamples(seeds, 1, 0, scheme="pool")


def test_corrected_resamples_give_the_rung_mean_the_seeds_sample_variance_over_n() -> None:
    """Every one of the 3³ equally likely draws of a rung's 3 seeds, enumerated: the resampled
    mean's variance is (n − 1)/n · s²/n plain, and s²/n corrected (s² with n − 1 below)."""
    losses = {0: {0: 3.10, 4: 3.13, 9: 3.05}}
    s2 = float(np.var(list(losses[0].values()), ddof=1))
    for correct, want in ((False, 2 / 3 * s2 / 3), (True, s2 / 3)):
        means = [np.mean(resampled_losses(losses, {0: ((0, a), (0, b), (0, c))}, correct)[0])
                 for a in losses[0] for b in losses[0] for c in losses[0]]  # fmt: skip
        assert np.mean(means) == pytest.approx(np.mean(list(losses[0].values())), rel=1e-12)
        assert np.var(means) == pytest.approx(want, rel=1e-9)
    assert resampled_losses(losses, {0: ((0, 4), (0, 4), (0, 0))}, correct=False) == {
        0: [3.13, 3.13, 3.10]}  # fmt: skip
    # pooled: rung 1's mean plus rung 0's deviations (rung 0: mean 3.0, n = 2, scale √2)
    two = {0: {0: 2.9, 1: 3.1}, 1: {0: 2.0, 1: 2.2}}
    got = resampled_losses(two, {1: ((0, 0), (0, 1))})[1]
    assert got == pytest.approx([2.1 - 0.1 * math.sqrt(2), 2.1 + 0.1 * math.sqrt(2)], rel=1e-12)


def test_the_pooled_bootstrap_interval_is_the_hand_computation() -> None:
    """2 seeds × 3 rungs, pooled: each rung's two resampled losses are its mean plus √2 times
    the deviations of two runs drawn from all six; both variants take the same runs."""
    points = ladder({"base": law, "v": lambda c: law(c, 1.3)}, rungs=RUNG_FLOPS[:3], noise=4e-3,
                    rng=3)  # fmt: skip
    fit = fit_ladder(points, baseline="base", bootstrap=100, seed=5)
    assert fit.resampling == "pooled" and "pooled over the rungs" in fit.table()
    loss = {(p.variant, p.rung, p.seed): p.loss for p in points}
    mean = {(v, r): (loss[v, r, 0] + loss[v, r, 1]) / 2 for v, r, _ in loss}
    full = {v: fit_power_law([p.flops for p in points if p.variant == v],
                             [p.loss for p in points if p.variant == v])
            for v in ("base", "v")}  # fmt: skip
    pool = [(r, s) for r in range(3) for s in range(2)]
    rng = np.random.default_rng(5)
    values = []
    for _ in range(100):
        drawn = {r: [pool[i] for i in rng.integers(0, 6, size=2)] for r in range(3)}
        refit = {v: fit_power_law(
            [RUNG_FLOPS[r] for r in range(3) for _ in range(2)],
            [mean[v, r] + math.sqrt(2) * (loss[v, q, s] - mean[v, q])
             for r in range(3) for q, s in drawn[r]], start=full[v]) for v in ("base", "v")}  # fmt: skip
        values.append(multiplier(refit["v"], refit["base"], RUNG_FLOPS[2]))
    values.sort()
    m = fit.variant("v").multiplier  # ranks ⌊0.025·99⌋ = 2 and ⌈0.975·99⌉ = 97
    assert (m.low, m.high) == (
        pytest.approx(values[2], rel=1e-6),
        pytest.approx(values[97], rel=1e-6),
    )


@pytest.mark.parametrize("correct", [True, False])
def test_the_bootstrap_interval_is_the_hand_computation_over_enumerated_resamples(
    correct: bool,
) -> None:
    """2 seeds × 3 rungs: each rung's resample is one of {0, 0}, {0, 1}, {1, 1}, so every
    resample is one of 27 data sets. Fit each once by hand, read the 200 resamples off the
    seeded generator, pair baseline and variant on each, take the order statistics. Corrected,
    a drawn seed's loss is its rung's mean plus √2 times its deviation from it (n = 2)."""
    points = ladder({"base": law, "v": lambda c: law(c, 1.3)}, rungs=RUNG_FLOPS[:3], noise=4e-3,
                    rng=2)  # fmt: skip
    fit = fit_ladder(points, baseline="base", bootstrap=200, seed=7, resampling="rung",
                     correct=correct)  # fmt: skip
    loss = {(p.variant, p.rung, p.seed): p.loss for p in points}
    if correct:
        mean = {(v, r): (loss[v, r, 0] + loss[v, r, 1]) / 2 for v, r, _ in loss}
        loss = {(v, r, s): mean[v, r] + math.sqrt(2) * (x - mean[v, r])
                for (v, r, s), x in loss.items()}  # fmt: skip
    full = {v: fit_power_law([p.flops for p in points if p.variant == v],
                             [p.loss for p in points if p.variant == v])
            for v in ("base", "v")}  # fmt: skip
    rng = np.random.default_rng(7)
    hand: dict[tuple[tuple[int, ...], ...], tuple[float, float]] = {}
    values, alphas = [], []
    for _ in range(200):
        draw = tuple(tuple(sorted(int(i) for i in rng.integers(0, 2, size=2))) for _ in range(3))
        if draw not in hand:
            refit = {v: fit_power_law([RUNG_FLOPS[r] for r in range(3) for _ in draw[r]],
                                      [loss[v, r, s] for r in range(3) for s in draw[r]],
                                      start=full[v]) for v in ("base", "v")}  # fmt: skip
            hand[draw] = (multiplier(refit["v"], refit["base"], RUNG_FLOPS[2]), refit["v"].alpha)
        values.append(hand[draw][0])
        alphas.append(hand[draw][1])
    assert len(hand) <= 27
    values.sort()
    alphas.sort()
    m = fit.variant("v").multiplier
    assert m.value == pytest.approx(multiplier(full["v"], full["base"], RUNG_FLOPS[2]), rel=1e-6)
    # ranks ⌊0.025·199⌋ = 4 and ⌈0.975·199⌉ = 195 of the sorted 200
    assert (m.low, m.high) == (
        pytest.approx(values[4], rel=1e-6),
        pytest.approx(values[195], rel=1e-6),
    )
    assert m.resamples == 200 and m.failed == 0 and m.low < m.value < m.high
    a = fit.variant("v").alpha
    assert (a.low, a.high) == (
        pytest.approx(alphas[4], rel=1e-6),
        pytest.approx(alphas[195], rel=1e-6),
    )
    assert fit.variant("base").multiplier.low is None  # the baseline against itself: 1, no interval
    assert fit.variant("v").held_out is None  # 3 rungs: nothing to hold out


def test_the_held_out_rung_is_predicted_by_the_law_fitted_without_it() -> None:
    points = ladder({"base": law, "v": lambda c: law(c, 2.0)}, noise=1e-3, rng=4)
    fit = fit_ladder(points, baseline="base", bootstrap=0)
    for v in ("base", "v"):
        mine = [p for p in points if p.variant == v]
        by_hand = fit_power_law([p.flops for p in mine if p.rung < 3],
                                [p.loss for p in mine if p.rung < 3])  # fmt: skip
        observed = (mine[-2].loss + mine[-1].loss) / 2  # rung 3's two seeds
        predicted = by_hand.predict(RUNG_FLOPS[3])
        h = fit.variant(v).held_out
        assert h is not None and h.rung == 3 and h.flops == RUNG_FLOPS[3]
        assert h.observed == pytest.approx(observed, rel=1e-12)
        assert h.predicted == pytest.approx(predicted, rel=1e-9)
        assert h.error == pytest.approx(predicted - observed, abs=1e-9)
        assert h.relative == pytest.approx((predicted - observed) / observed, abs=1e-9)
        assert h.spread == pytest.approx(
            abs(mine[-2].loss - mine[-1].loss) / math.sqrt(2), rel=1e-9
        )
        assert abs(h.relative) < 0.01  # 0.1 % noise: the law extrapolates one decade within 1 %


def test_one_seed_a_rung_gives_no_interval_and_the_table_says_so() -> None:
    fit = fit_ladder(ladder({"base": law, "v": lambda c: law(c, 1.2)}, seeds=1), baseline="base",
                     bootstrap=50)  # fmt: skip
    assert fit.variant("v").multiplier.low is None and fit.variant("v").replicates == ()
    assert "No intervals: they need 2 or more seeds a rung" in fit.table()


def test_the_table_sorts_by_multiplier_and_its_json_is_strict() -> None:
    points = ladder({"base": law, "worse": lambda c: law(c, 0.6), "better": lambda c: law(c, 2.5),
                     "below": lambda c: law(c) - 0.5}, noise=1e-3)  # fmt: skip
    fit = fit_ladder(points, baseline="base", bootstrap=20)
    assert [v.variant for v in fit.ranked()] == ["base", "worse", "better", "below"]
    assert [v.variant for v in fit.ranked("multiplier")] == ["below", "better", "base", "worse"]
    assert [v.variant for v in fit.ranked("loss")] == ["below", "better", "base", "worse"]
    text = fit.table("multiplier")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `below`", "| `better`", "| `base`", "| `worse`"]
    assert "1 (baseline)" in rows[2] and "∞" in rows[0]  # `below` is under the baseline's E
    h = fit.variant("better").held_out
    assert h is not None and h.spread is not None
    assert f"rung 3: {h.predicted:.3f} / {h.observed:.3f} ({h.error:+.3f}, " in rows[1]
    assert f"; seeds ±{h.spread:.3f})" in rows[1]
    assert "C* = 1e+15 FLOPs" in text and "20 resamples" in text
    data = json.loads(json.dumps(fit.to_json("multiplier"), allow_nan=False))
    assert [v["variant"] for v in data["variants"]] == ["below", "better", "base", "worse"]
    assert data["variants"][0]["multiplier"]["value"] is None  # ∞ has no JSON
    assert data["variants"][1]["multiplier"]["value"] == pytest.approx(
        fit.variant("better").multiplier.value
    )
    with raises_naming(
        FitError, "--sort 'multipler'", "did you mean 'multiplier'", "multiplier or loss"
    ):
        fit.table("multipler")
    with raises_naming(FitError, "no variant 'bettr'", "did you mean 'better'"):
        fit.variant("bettr")


def test_chinchillas_law_is_fitted_when_the_ladder_varies_n_and_d_apart() -> None:
    def ch(n: int, d: int) -> float:
        return 1.69 + 406.4 / n**0.34 + 410.7 / d**0.28

    points = [Point(v, 0, r, params=n, tokens=d, flops=6.0 * n * d, loss=ch(n, d) + off)
              for v, off in (("base", 0.0), ("v", -0.01))
              for r, (n, d) in enumerate((n, d) for n in (10**6, 10**7, 10**8)
                                         for d in (10**8, 10**9, 10**10))]  # fmt: skip
    fit = fit_ladder(points, baseline="base", bootstrap=0)
    c = fit.variant("base").chinchilla
    assert (
        c is not None
        and c.alpha == pytest.approx(0.34, rel=1e-4)
        and c.beta == pytest.approx(0.28, rel=1e-4)
    )
    assert "Chinchilla's L(N, D)" in fit.table()
    fixed = fit_ladder(ladder({"base": law}), baseline="base", bootstrap=0)
    assert fixed.variant("base").chinchilla is None  # one token count: no L(N, D)


def test_ladder_errors_name_the_variant_rung_and_seed() -> None:
    good = ladder({"base": law, "nope": lambda c: law(c, 1.1)})
    with raises_naming(FitError, "no points"):
        fit_ladder([], baseline="base")
    with raises_naming(
        FitError, "baseline 'bsae' has no points", "did you mean 'base'", "base, nope"
    ):
        fit_ladder(good, baseline="bsae")
    two = [p for p in good if p.rung < 2]
    with raises_naming(FitError, "'base' has 2 rungs (0, 1)", "needs 3 or more rungs",
                       "held-out check 4"):  # fmt: skip
        fit_ladder(two, baseline="base")
    short = [p for p in good if not (p.variant == "nope" and p.rung in (2, 3))]
    with raises_naming(FitError, "variant 'nope' lacks rungs 2, 3", "rungs 0, 1, 2, 3"):
        fit_ladder(short, baseline="base")
    extra = [*good, Point("nope", 0, 9, 10, 10, 1e16, 2.0), Point("nope", 1, 9, 10, 10, 1e16, 2.0)]
    with raises_naming(FitError, "variant 'nope' has rung 9 the baseline lacks"):
        fit_ladder(extra, baseline="base")
    with raises_naming(FitError, "variant 'nope', rung 1: seeds [0]", "the baseline's [0, 1]"):
        fit_ladder([p for p in good if not (p.variant == "nope" and p.rung == 1 and p.seed == 1)],
                   baseline="base")  # fmt: skip

    def bad(**kw: object) -> list[Point]:  # seed 1 of nope's rung 2 changed
        return [Point(**{**p.__dict__, **kw}) if (p.variant, p.rung, p.seed) == ("nope", 2, 1)
                else p for p in good]  # fmt: skip

    for kw, said in (({"loss": math.nan}, "loss nan"), ({"loss": -1.0}, "loss -1.0"),
                     ({"loss": math.inf}, "loss inf"), ({"flops": 0.0}, "flops 0.0"),
                     ({"params": 0}, "params 0")):  # fmt: skip
        with raises_naming(FitError, "variant 'nope', rung 2, seed 1", said):
            fit_ladder(bad(**kw), baseline="base")
    with raises_naming(FitError, "variant 'nope', rung 2", "seeds' compute differs"):
        fit_ladder(bad(flops=2e14), baseline="base")
    with raises_naming(FitError, "variant 'nope', rung 0: seed 1 appears twice"):
        fit_ladder([*good, good[-7]], baseline="base")
    with raises_naming(FitError, "bootstrap -1"):
        fit_ladder(good, baseline="base", bootstrap=-1)
    with raises_naming(FitError, "confidence 1.5"):
        fit_ladder(good, baseline="base", confidence=1.5)
    with raises_naming(FitError, "target compute -5"):
        fit_ladder(good, baseline="base", target_flops=-5.0)


def test_resamples_that_do_not_fit_are_left_out_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lmcore.ladder.fits as fits

    calls = []
    refit = fits._refit

    def every_fourth_fails(*args: object) -> PowerLaw | None:
        calls.append(1)
        return None if len(calls) % 4 == 0 else refit(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fits, "_refit", every_fourth_fails)
    fit = fit_ladder(ladder({"base": law, "v": lambda c: law(c, 1.2)}, noise=1e-3), baseline="base",
                     bootstrap=30)  # fmt: skip
    # the baseline's refits are calls 1-30: resamples 3, 7, ..., 27 fail (7); the variant's are
    # calls 31-60: resamples 1, 5, ..., 29 fail (8); a pair needs both, so 15 pairs fail
    assert fit.variant("base").alpha.failed == 7 and fit.variant("v").alpha.failed == 8
    assert fit.variant("v").multiplier.failed == 15 and fit.variant("v").multiplier.resamples == 15
    assert "did not fit (left out of the intervals): `base` 7, `v` 15 of 30" in fit.table()
