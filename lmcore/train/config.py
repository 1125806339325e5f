"""Every option of a training run, checked, and the learning-rate schedule; no torch here, so
the command line reads the defaults without importing it.

    config = TrainConfig(steps=300, lr=3e-3).resolved(context_length=128)
    cosine_lr(t, lr=config.lr, min_lr=config.min_lr, warmup=config.warmup,
              decay_steps=config.decay_steps)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from lmcore.errors import TrainError

__all__ = ["AUTOCAST", "CLI_OPTIONS", "DTYPES", "RESUMABLE", "TRACKERS", "TrainConfig", "cosine_lr"]

DTYPES: Final = ("float32", "bfloat16", "float16")
AUTOCAST: Final = ("bfloat16",)
TRACKERS: Final = ("tensorboard", "mlflow", "wandb")  # lmcore.train.trackers


# ------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a run, with its default. `resolved()` fills in the derived ones."""

    steps: int = 1000  # optimizer steps (updates)
    tokens: int | None = None  # instead of steps: ceil(tokens / (batch_size × context_length))
    batch_size: int = 32  # sequences per step, all processes together
    lr: float = 1e-3  # peak learning rate, reached after warmup
    min_lr: float | None = None  # the schedule's floor; default lr / 10
    warmup: int | None = None  # linear warmup steps; default 10% of steps (rounded)
    decay_steps: int | None = None  # where the cosine reaches min_lr; default steps
    weight_decay: float = 0.1  # AdamW's decoupled decay, on matrices only
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float | None = 1.0  # global L2 norm; None: no clipping
    eval_every: int = 100  # steps between evaluations (0: only before and after)
    eval_batches: int = 20  # fixed validation batches of batch_size sequences
    log_every: int = 10  # steps per train record in metrics.jsonl
    save_every: int = 1000  # steps between checkpoints (0: only at the end and on interrupt)
    keep: int = 2  # newest checkpoints kept (0: all)
    seed: int = 0  # the weights' initialisation and the order of the batches
    device: str = "auto"  # auto: cuda if available, else cpu
    dtype: str | None = None  # parameters: float32, or a checkpoint's own dtype
    autocast: str | None = None  # "bfloat16": forward under torch.autocast
    compile: bool = False  # torch.compile the model
    eval_bpb: bool = False  # evaluations also report bits per byte (val_bpb)
    loggers: tuple[str, ...] = ()  # trackers beside metrics.jsonl (lmcore.train.trackers)
    log_group: str | None = None  # the trackers' experiment / group (a sweep's name)

    def resolved(self, context_length: int) -> TrainConfig:
        """This config with `steps` (from `tokens`), `min_lr`, `warmup` and `decay_steps` set,
        checked; `TrainError` names the first bad option."""
        self.check()
        steps = self.steps
        if self.tokens is not None:
            steps = max(1, math.ceil(self.tokens / (self.batch_size * context_length)))
        out = dataclasses.replace(
            self,
            steps=steps,
            min_lr=self.lr / 10 if self.min_lr is None else self.min_lr,
            warmup=round(0.1 * steps) if self.warmup is None else self.warmup,
            decay_steps=steps if self.decay_steps is None else self.decay_steps,
        )
        out.check()
        return out

    def check(self) -> None:
        """`TrainError` for the first option out of its range, named as on the command line."""
        positive = {"steps": self.steps, "batch_size": self.batch_size, "eval_batches":
                    self.eval_batches, "log_every": self.log_every}  # fmt: skip
        for name, value in positive.items():
            _require(isinstance(value, int) and value >= 1, name, value, "a positive integer")
        if self.tokens is not None:
            _require(self.tokens >= 1, "tokens", self.tokens, "a positive integer")
        for name, value in {"eval_every": self.eval_every, "save_every": self.save_every,
                            "keep": self.keep, "seed": self.seed}.items():  # fmt: skip
            _require(isinstance(value, int) and value >= 0, name, value, "an integer ≥ 0")
        _require(self.seed < 2**64, "seed", self.seed, "below 2**64 (torch's seeds are 64-bit)")
        _require(math.isfinite(self.lr) and self.lr > 0, "lr", self.lr, "a number > 0, e.g. 1e-3")
        if self.min_lr is not None:
            _require(0 <= self.min_lr <= self.lr, "min_lr", self.min_lr, f"in [0, lr={self.lr}]")
        if self.warmup is not None:
            _require(self.warmup >= 0, "warmup", self.warmup, "an integer ≥ 0")
        if self.decay_steps is not None:
            _require(self.decay_steps >= 1, "decay_steps", self.decay_steps, "at least 1")
            if self.warmup is not None:
                _require(self.warmup <= self.decay_steps, "warmup", self.warmup,
                         f"at most decay_steps={self.decay_steps}")  # fmt: skip
        _require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number ≥ 0")
        _require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "betas",
            " ".join(map(str, self.betas)),
            "two numbers in [0, 1), e.g. 0.9 0.95",
        )
        _require(self.eps > 0, "eps", self.eps, "a number > 0")
        if self.grad_clip is not None:
            _require(self.grad_clip > 0, "grad_clip", self.grad_clip, "> 0 (or 0 for no clipping)")
        _require(self.dtype in (None, *DTYPES), "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        _require(self.autocast in (None, *AUTOCAST), "autocast", self.autocast, "bfloat16")
        for name in self.loggers:
            _require(name in TRACKERS, "logger", name, f"one of {', '.join(TRACKERS)}")

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "betas": list(self.betas),
            "loggers": list(self.loggers),
        }

    def given(self) -> dict[str, Any]:
        """The options that differ from the defaults, as `to_json` writes them."""
        default = TrainConfig().to_json()
        return {k: v for k, v in self.to_json().items() if v != default[k]}

    def cli_args(self) -> list[str]:
        """The `lmcore train` options that give this config (those that differ from the
        defaults); `TrainError` for an option the command line does not have."""
        default, args = TrainConfig(), []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name) or (f.name == "steps" and self.tokens):
                continue
            flag = f"--{f.name.replace('_', '-')}"
            if f.name not in CLI_OPTIONS:
                raise TrainError(
                    f"{f.name}={value}: lmcore train has no option for it (it takes "
                    f"{', '.join(CLI_OPTIONS)}); leave it at its default {getattr(default, f.name)}"
                )
            if f.name == "betas":
                args += [flag, *(str(b) for b in value)]
            elif f.name == "grad_clip":
                args += [flag, "0" if value is None else repr(value)]
            elif f.name == "autocast":
                args.append("--bf16")
            elif f.name in ("compile", "eval_bpb"):
                args.append(flag)
            elif f.name == "loggers":
                args += [a for name in value for a in ("--logger", name)]
            else:
                args += [flag, repr(value) if isinstance(value, float) else str(value)]
        return args

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrainError(f"unknown training options {', '.join(unknown)} in a run.json")
        values = dict(data)
        for key in ("betas", "loggers"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def _require(ok: bool, name: str, value: object, what: str) -> None:
    if not ok:
        raise TrainError(f"--{name.replace('_', '-')} {value}: must be {what}")


# Options `lmcore train` takes on its command line (`eps` and `decay_steps` it does not).
CLI_OPTIONS: Final = (
    "steps", "tokens", "batch_size", "lr", "min_lr", "warmup", "weight_decay", "grad_clip",
    "eval_every", "eval_batches", "log_every", "save_every", "keep", "seed", "device", "betas",
    "dtype", "autocast", "compile", "eval_bpb", "loggers", "log_group",
)  # fmt: skip

# Options a resumed run may change: none of them changes the steps already taken.
RESUMABLE: Final = ("steps", "tokens", "device", "eval_every", "save_every", "log_every", "keep",
                     "eval_bpb", "loggers", "log_group")  # fmt: skip


def cosine_lr(t: float, *, lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """CS336's learning rate at step `t`: `t / warmup · lr` while `t < warmup`; then
    `min_lr + ½ (1 + cos(π (t - warmup) / (decay_steps - warmup))) (lr - min_lr)` up to
    `decay_steps`; `min_lr` after."""
    if t < warmup:
        return t / warmup * lr
    if t <= decay_steps:
        if decay_steps == warmup:
            return lr
        progress = (t - warmup) / (decay_steps - warmup)
        return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)
    return min_lr
