"""schedule=cosine | wsd | linear | constant: the learning rate at step t, each a row of one
table. All warm up linearly from 0 to `lr` over `warmup` steps (the run's `--warmup`); after
the warmup they differ:

- cosine: CS336's, `min_lr + ½ (1 + cos(π p)) (lr - min_lr)` with p going 0 → 1 from the
  warmup's end to `decay_steps`; `min_lr` after (today's `cosine_lr`, unchanged);
- wsd: warmup–stable–decay: `lr` until the last `decay` fraction of the steps, then down to
  `min_lr` by `shape` (linear, cosine, or sqrt: `lr - (lr - min_lr) sqrt(p)`, Hägele et
  al., 2024);
- linear: straight from `lr` to `min_lr` at `decay_steps`, `min_lr` after;
- constant: `lr`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from lmcore import Arg, Component, hookimpl
from lmcore.train.config import cosine_lr

Schedule = Callable[[int], float]

SHAPES = ("linear", "cosine", "sqrt")


def _warm(t: int, lr: float, warmup: int) -> float | None:
    return t / warmup * lr if t < warmup else None


def _decayed(shape: str, progress: float, lr: float, min_lr: float) -> float:
    """From `lr` (progress 0) to `min_lr` (progress 1) along `shape`."""
    p = min(max(progress, 0.0), 1.0)
    if shape == "linear":
        return lr - (lr - min_lr) * p
    if shape == "cosine":
        return min_lr + 0.5 * (1 + math.cos(math.pi * p)) * (lr - min_lr)
    return lr - (lr - min_lr) * math.sqrt(p)  # sqrt: Hägele et al.'s "1-sqrt"


def cosine(lr: float, min_lr: float, warmup: int, decay_steps: int) -> Schedule:
    return lambda t: cosine_lr(t, lr=lr, min_lr=min_lr, warmup=warmup, decay_steps=decay_steps)


def wsd(lr: float, min_lr: float, warmup: int, steps: int, decay: float, shape: str) -> Schedule:
    # The decay phase: the last round(decay · steps) updates, never into the warmup.
    start = max(warmup, steps - round(decay * steps))
    length = steps - start

    def at(t: int) -> float:
        warm = _warm(t, lr, warmup)
        if warm is not None:
            return warm
        if t < start or length == 0:
            return lr
        return _decayed(shape, (t - start) / length, lr, min_lr)

    return at


def linear(lr: float, min_lr: float, warmup: int, decay_steps: int) -> Schedule:
    def at(t: int) -> float:
        warm = _warm(t, lr, warmup)
        if warm is not None:
            return warm
        if decay_steps == warmup:
            return lr if t <= decay_steps else min_lr
        return _decayed("linear", (t - warmup) / (decay_steps - warmup), lr, min_lr)

    return at


def constant(lr: float, warmup: int) -> Schedule:
    def at(t: int) -> float:
        warm = _warm(t, lr, warmup)
        return lr if warm is None else warm

    return at


def _check_wsd(decay: float) -> None:
    if decay > 1:
        raise ValueError(f"decay is a fraction of the steps, at most 1; got {decay!r}")


@dataclass(frozen=True)
class _Row:
    name: str
    build: Callable[..., Schedule]
    help: str
    args: tuple[Arg, ...] = ()
    validate: Callable[..., None] | None = None


ROWS = (
    _Row("cosine", cosine, "linear warmup, cosine decay to min_lr at decay_steps (CS336's)"),
    _Row(
        "wsd",
        wsd,
        "warmup-stable-decay: lr until the last `decay` of the steps, then down to min_lr",
        (
            Arg("decay", float, 0.2, "the fraction of the steps spent decaying", gt=0.0),
            Arg("shape", str, "sqrt", "the decay's shape", choices=SHAPES),
        ),
        _check_wsd,
    ),
    _Row("linear", linear, "linear warmup, linear decay to min_lr at decay_steps"),
    _Row("constant", constant, "linear warmup, then lr throughout"),
)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="schedule", name=r.name, build=r.build, args=r.args, help=r.help,
            validate=r.validate,
        )
        for r in ROWS
    ]
