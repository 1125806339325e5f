"""The training config: CS336's cosine schedule, the defaults a config resolves to and the
checks of its options, each named by its flag."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmcore.errors import TrainError
from lmcore.train.config import ResolvedConfig, TrainConfig, cosine_lr


def reference_lr(t: float, a_max: float, a_min: float, tw: int, tc: int) -> float:
    """CS336 §4.4's cosine schedule with warmup, as the handout writes it."""
    if t < tw:
        return t / tw * a_max
    if t > tc:
        return a_min
    return a_min + 0.5 * (1 + np.cos((t - tw) / (tc - tw) * np.pi)) * (a_max - a_min)


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0, 0.0),  # warmup starts at zero
        (5, 0.5e-3),  # half way up
        (10, 1e-3),  # the peak
        (55, 0.55e-3),  # half way down the cosine: the mean of peak and floor
        (100, 1e-4),  # the floor at decay_steps
        (150, 1e-4),  # and after it
    ],
)
def test_cosine_schedule_at_warmup_peak_decay_and_floor(t: int, expected: float) -> None:
    got = cosine_lr(t, lr=1e-3, min_lr=1e-4, warmup=10, decay_steps=100)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert got == pytest.approx(reference_lr(t, 1e-3, 1e-4, 10, 100), rel=1e-12, abs=1e-15)


def test_cosine_schedule_follows_the_formula_everywhere() -> None:
    for t in range(0, 300, 7):
        assert cosine_lr(t, lr=3e-3, min_lr=0.0, warmup=20, decay_steps=250) == pytest.approx(
            reference_lr(t, 3e-3, 0.0, 20, 250), rel=1e-12, abs=1e-15
        )
    assert cosine_lr(0, lr=1e-3, min_lr=1e-4, warmup=0, decay_steps=10) == 1e-3  # no warmup


def test_resolved_defaults() -> None:
    c = TrainConfig(steps=300, lr=2e-3).resolved(context_length=128)
    assert (c.min_lr, c.warmup, c.decay_steps) == (2e-4, 30, 300)
    by_tokens = TrainConfig(tokens=1_000_000, batch_size=16).resolved(context_length=128)
    assert by_tokens.steps == math.ceil(1_000_000 / (16 * 128)) == 489


def test_options_are_checked_with_their_flags() -> None:
    for bad, message in [
        ({"lr": -1.0}, r"--lr -1.0: must be a number > 0"),
        ({"min_lr": 1.0}, r"--min-lr 1.0: must be in \[0, lr=0.001\]"),
        ({"betas": (0.9, 1.5)}, r"--betas 0.9 1.5: must be two numbers in \[0, 1\)"),
        ({"batch_size": 0}, r"--batch-size 0: must be a positive integer"),
        ({"warmup": 50, "steps": 10}, r"--warmup 50: must be at most decay_steps=10"),
        ({"autocast": "float16"}, r"--autocast float16: must be bfloat16"),
        ({"seed": 2**64}, r"--seed 18446744073709551616: must be below 2\*\*64"),
    ]:
        with pytest.raises(TrainError, match=message):
            TrainConfig(**bad).resolved(context_length=16)  # type: ignore[arg-type]


def test_a_resolved_config_has_its_derived_options_set() -> None:
    cfg = TrainConfig(steps=50).resolved(context_length=16)
    assert isinstance(cfg, ResolvedConfig)
    assert (cfg.min_lr, cfg.warmup, cfg.decay_steps, cfg.dtype) == (1e-4, 5, 50, "float32")
    assert TrainConfig(dtype="float16").resolved(16, dtype="bfloat16").dtype == "float16"
    assert ResolvedConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(TrainError, match=r"config without min_lr, dtype"):
        ResolvedConfig.from_json({**cfg.to_json(), "min_lr": None, "dtype": None})
