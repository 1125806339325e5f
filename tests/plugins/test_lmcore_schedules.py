"""The schedules against their formulas: cosine is today's `cosine_lr` exactly; wsd, linear and
constant warm up alike and then hold, decay or stay as they say."""

from __future__ import annotations

import math

import pytest

from lmcore.errors import SpecError
from lmcore.train.config import cosine_lr
from lmcore.train.recipe import build_schedule, resolve_recipe

RUN = {"lr": 1e-3, "min_lr": 1e-4, "warmup": 10, "decay_steps": 100, "steps": 100}


def _schedule(text: str, **run: float) -> list[float]:
    fn = build_schedule(resolve_recipe("schedule", text), **{**RUN, **run})  # type: ignore[arg-type]
    return [fn(t) for t in range(int({**RUN, **run}["steps"]) + 5)]


def test_cosine_is_todays_schedule_exactly() -> None:
    got = _schedule("cosine")
    want = [cosine_lr(t, lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=100) for t in range(105)]
    assert got == want


def test_every_schedule_warms_up_alike() -> None:
    for text in ("cosine", "wsd", "linear", "constant"):
        assert _schedule(text)[:10] == [t / 10 * 1e-3 for t in range(10)], text


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_holds_then_decays_over_its_fraction(shape: str) -> None:
    lrs = _schedule(f"wsd(decay=0.25, shape={shape})")
    assert all(lr == 1e-3 for lr in lrs[10:75])  # stable until the last quarter
    for t in range(75, 101):
        p = (t - 75) / 25
        want = {
            "linear": 1e-3 - 9e-4 * p,
            "cosine": 1e-4 + 0.5 * (1 + math.cos(math.pi * p)) * 9e-4,
            "sqrt": 1e-3 - 9e-4 * math.sqrt(p),
        }[shape]
        assert lrs[t] == pytest.approx(want, rel=1e-12), t
    assert lrs[104] == pytest.approx(1e-4)


def test_wsd_never_decays_into_the_warmup() -> None:
    lrs = _schedule("wsd(decay=1.0, shape=linear)")
    assert lrs[10] == 1e-3 and lrs[100] == pytest.approx(1e-4)


def test_linear_and_constant() -> None:
    lin = _schedule("linear")
    assert lin[55] == pytest.approx(1e-3 - 9e-4 * 45 / 90) and lin[104] == pytest.approx(1e-4)
    const = _schedule("constant")
    assert const[0] == 0.0 and set(const[10:]) == {1e-3}


def test_a_bad_schedule_argument_is_refused_with_the_choices() -> None:
    with pytest.raises(SpecError, match=r"decay is a fraction of the steps, at most 1; got 1.5"):
        resolve_recipe("schedule", "wsd(decay=1.5)")
    with pytest.raises(SpecError, match=r"must be one of cosine, linear, sqrt, got 'cosin' \(did you mean 'cosine'"):
        resolve_recipe("schedule", "wsd(shape=cosin)")
