"""Every option of a training run, declared once (`lmcore.train.options` derives the flags,
the checks and the resumable set from it), and the learning-rate schedule; no torch here, so
the command line reads the defaults without importing it.

    config = TrainConfig(steps=300, lr=3e-3).resolved(context_length=128)  # a ResolvedConfig
    cosine_lr(t, lr=config.lr, min_lr=config.min_lr, warmup=config.warmup,
              decay_steps=config.decay_steps)
"""

from __future__ import annotations

import dataclasses
import math
from argparse import ArgumentTypeError
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from lmcore.components import ROLES
from lmcore.errors import TrainError, did_you_mean
from lmcore.model.recompute import RecomputeError, targets
from lmcore.train import options
from lmcore.train.options import Check, Flag, among, count, option, positive, seed_value

__all__ = [
    "AUTOCAST",
    "CLI_OPTIONS",
    "DTYPES",
    "RESUMABLE",
    "TRACKERS",
    "ResolvedConfig",
    "TrainConfig",
    "cosine_lr",
]

DTYPES: Final = ("float32", "bfloat16", "float16")
AUTOCAST: Final = ("bfloat16",)
TRACKERS: Final = ("tensorboard", "mlflow", "wandb")  # lmcore.train.trackers


# ------------------------------------------------------------------------------ options


def roles_list(text: str) -> str:
    """`--decay`'s value, comma-separated parameter roles or `none`, written canonically (an
    `ArgumentTypeError` names a role that is not one)."""
    names = tuple(r.strip() for r in text.split(",") if r.strip())
    if names in ((), ("none",)):
        return "none"
    for name in names:
        if name not in ROLES:
            raise ArgumentTypeError(
                f"{name!r} is not a parameter role; roles are {', '.join(ROLES)}"
                + did_you_mean(name, ROLES)
            )
    return ",".join(dict.fromkeys(names))


def decay_roles(text: str) -> tuple[str, ...]:
    """The roles `--decay` names (none for `none`)."""
    return () if text == "none" else tuple(text.split(","))


def _roles_ok(text: object) -> bool:
    try:
        return isinstance(text, str) and roles_list(text) == text
    except ArgumentTypeError:
        return False


def recompute_value(text: str) -> str:
    """`--recompute`'s value (`lmcore.model.recompute`'s grammar), written canonically."""
    try:
        return targets(text)
    except RecomputeError as e:
        raise ArgumentTypeError(str(e).removeprefix(f"--recompute {text!r}: ")) from None


def _recompute_ok(text: object) -> bool:
    try:
        return isinstance(text, str) and targets(text) == text
    except RecomputeError:
        return False


def role_multiplier(text: str) -> str:
    """`--role-lr`'s value, `ROLE=MULT`, checked and written back canonically."""
    role, sep, mult = text.partition("=")
    role = role.strip()
    if not sep or role not in ROLES:
        raise ArgumentTypeError(
            f"{text!r} is not ROLE=MULT with a role among {', '.join(ROLES)}"
            + (did_you_mean(role, ROLES) if sep else "")
        )
    try:
        value = float(mult)
    except ValueError:
        raise ArgumentTypeError(
            f"{text!r}: the multiplier {mult.strip()!r} is not a number"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise ArgumentTypeError(f"{text!r}: the multiplier must be a number > 0")
    return f"{role}={value!r}"


def _multiplier_ok(text: object) -> bool:
    try:
        return isinstance(text, str) and role_multiplier(text) == text
    except ArgumentTypeError:
        return False


def role_multipliers(values: tuple[str, ...]) -> dict[str, float]:
    """`--role-lr`'s values as a table; a role given twice: the last one."""
    return {r: float(m) for r, _, m in (v.partition("=") for v in values)}


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a run, each declared once: its default, its help (the command line's),
    its flag, whether a resumed run may change it, and its range (`lmcore.train.options`).
    `resolved()` fills in the derived ones."""

    steps: int = option(
        1000,
        "optimizer steps (default: {default})",
        Flag(type=positive, metavar="N", exclusive="budget"),
        resumable=True,
        checks=(count(1),),
    )
    tokens: int | None = option(
        None,
        "train on N tokens instead: steps = ceil(N / (batch size × context length))",
        Flag(type=positive, metavar="N", exclusive="budget"),
        resumable=True,
        checks=(Check(lambda v, _: v >= 1, "a positive integer"),),
    )
    batch_size: int = option(
        32,
        "sequences per step (default: {default})",  # all processes together
        Flag(type=positive, metavar="B"),
        checks=(count(1),),
    )
    context: int | None = option(
        None,
        "train on windows of N tokens, at most the model's context_length, e.g. to fine-tune "
        "a long-context checkpoint on short conversations (default: the model's context_length)",
        Flag(type=positive, metavar="N"),
        checks=(count(1),),
    )
    micro_batch: int | None = option(
        None,
        "accumulate the gradients of micro-batches of B sequences (all processes together; "
        "a divisor of --batch-size) into one update, the whole batch's (default: the whole "
        "batch at once)",
        Flag(type=positive, metavar="B"),
        resumable=True,
        checks=(
            count(1),
            Check(lambda v, c: c.batch_size % v == 0, "a divisor of --batch-size {batch_size}"),
        ),
    )
    pack: bool = option(
        False,
        "draw rows packed with whole documents (long ones cut into pieces, the rest padding) "
        "instead of windows across the token stream; needs data with a document index "
        "(docs/training.md)",
        Flag(action="store_true"),
    )
    doc_mask: bool = option(
        False,
        "document masking: each token attends only to its own document, positions restart at "
        "each document, and no target crosses into the next one (with or without --pack; "
        "needs data with a document index)",
        Flag(action="store_true"),
    )
    lr: float = option(
        1e-3,
        "peak learning rate (default: {default:g})",  # reached after warmup
        Flag(type=float, metavar="LR"),
        checks=(Check(lambda v, _: math.isfinite(v) and v > 0, "a number > 0, e.g. 1e-3"),),
    )
    min_lr: float | None = option(
        None,
        "the cosine schedule's floor (default: lr / 10)",
        Flag(type=float, metavar="LR"),
        checks=(Check(lambda v, c: 0 <= v <= c.lr, "in [0, lr={lr}]"),),
    )
    warmup: int | None = option(
        None,
        "linear warmup steps (default: 10% of the steps)",  # rounded
        Flag(type=int, metavar="N"),
        checks=(
            Check(lambda v, _: v >= 0, "an integer ≥ 0"),
            Check(lambda v, c: c.decay_steps is None or c.decay_steps < 1 or v <= c.decay_steps,
                  "at most decay_steps={decay_steps}"),  # below 1, decay_steps' own check fails
        ),
    )  # fmt: skip
    decay_steps: int | None = option(
        None,
        "where the cosine reaches min_lr (default: the steps)",
        checks=(Check(lambda v, _: v >= 1, "at least 1"),),
    )
    weight_decay: float = option(
        0.1,
        "decoupled weight decay, on the roles --decay names (default: {default:g})",
        Flag(type=float, metavar="WD"),
        checks=(Check(lambda v, _: v >= 0, "a number ≥ 0"),),
    )
    betas: tuple[float, float] = option(
        (0.9, 0.95),
        "AdamW's betas (default: {default[0]} {default[1]})",
        Flag(type=float, nargs=2, metavar=("B1", "B2"), after="device"),
        checks=(
            Check(lambda v, _: len(v) == 2 and all(0 <= b < 1 for b in v),
                  "two numbers in [0, 1), e.g. 0.9 0.95"),
        ),
    )  # fmt: skip
    eps: float = option(
        1e-8,
        "AdamW's epsilon (default: {default:g})",
        checks=(Check(lambda v, _: v > 0, "a number > 0"),),
    )
    optimizer: str = option(
        "adamw",
        "the optimizer, a registered one as a spec writes a component: adamw, "
        "'muon(fallback=adamw)', 'sgd(momentum=0.9)' (default: {default})",
        Flag(metavar="OPTIMIZER"),
        checks=(Check(lambda v, _: isinstance(v, str) and v.strip() != "", "a component, e.g. adamw"),),
    )
    schedule: str = option(
        "cosine",
        "the learning-rate schedule, e.g. cosine, 'wsd(decay=0.2)', constant "
        "(default: {default})",
        Flag(metavar="SCHEDULE"),
        checks=(Check(lambda v, _: isinstance(v, str) and v.strip() != "", "a component, e.g. cosine"),),
    )
    decay: str = option(
        "matrix,packed,head,router,conv",
        "the parameter roles weight decay applies to, comma-separated "
        "(default: matrix,packed,head,router,conv; none: no decay)",
        Flag(type=roles_list, metavar="ROLES", example="matrix,gain"),
        checks=(Check(lambda v, _: _roles_ok(v), f"roles among {', '.join(ROLES)}, or none"),),
    )
    role_lr: tuple[str, ...] = option(
        (),
        "a learning-rate multiplier for one parameter role, ROLE=MULT (repeatable), e.g. "
        "embedding=2",
        Flag("--role-lr", action="append", type=role_multiplier, metavar="ROLE=MULT",
             example="embedding=2.0"),
        checks=(Check(lambda v, _: _multiplier_ok(v),
                      f"ROLE=MULT with ROLE among {', '.join(ROLES)} and MULT > 0"),),
    )  # fmt: skip
    grad_clip: float | None = option(
        1.0,
        "global gradient norm; 0: off (default: {default:g})",  # L2, over all parameters
        Flag(type=float, metavar="NORM", off=0),
        checks=(Check(lambda v, _: v > 0, "> 0 (or 0 for no clipping)"),),
    )
    z_loss: float = option(
        0.0,
        "add PaLM's z-loss on the output logits, COEF · mean (log Z)², to the loss (PaLM: 1e-4; "
        "default: 0, off)",
        Flag(type=float, metavar="COEF", example="1e-4"),
        checks=(Check(lambda v, _: isinstance(v, int | float) and math.isfinite(v) and v >= 0,
                      "a number ≥ 0 (0: off), e.g. 1e-4"),),
    )  # fmt: skip
    eval_every: int = option(
        100,
        "steps between evaluations; 0: only first and last (default: {default})",
        Flag(type=int, metavar="N"),
        resumable=True,
        checks=(count(0),),
    )
    eval_batches: int = option(
        20,
        "fixed validation batches (default: {default})",  # of batch_size sequences
        Flag(type=positive, metavar="N"),
        checks=(count(1),),
    )
    log_every: int = option(
        10,
        "steps per metrics record (default: {default})",  # train records in metrics.jsonl
        Flag(type=positive, metavar="N"),
        resumable=True,
        checks=(count(1),),
    )
    save_every: int = option(
        1000,
        "steps between checkpoints; 0: only at the end (default: {default})",  # and on Ctrl-C
        Flag(type=int, metavar="N"),
        resumable=True,
        checks=(count(0),),
    )
    keep: int = option(
        2,
        "newest checkpoints kept; 0: all (default: {default})",
        Flag(type=int, metavar="N"),
        resumable=True,
        checks=(count(0),),
    )
    seed: int = option(
        0,
        "initial weights and batch order (default: {default})",
        Flag(type=seed_value, metavar="N"),
        checks=(count(0), Check(lambda v, _: v < 2**64, "below 2**64 (torch's seeds are 64-bit)")),
    )
    device: str = option(
        "auto",
        "auto (cuda if available, else cpu), cpu, cuda:N (default: {default})",
        Flag(type=str, metavar="DEVICE"),
        resumable=True,
    )
    dtype: str | None = option(
        None,
        "parameter dtype (default: float32, or a checkpoint's)",
        Flag(choices=DTYPES),
        checks=(among(DTYPES),),
    )
    autocast: str | None = option(
        None,
        "run the forward under bfloat16 autocast (parameters stay in --dtype)",
        Flag("--bf16", action="store_const", const=AUTOCAST[0]),
        checks=(Check(lambda v, _: v in AUTOCAST, "bfloat16"),),
    )
    compile: bool = option(False, "torch.compile the model", Flag(action="store_true"))
    recompute: str | None = option(
        None,
        "recompute activations in backward instead of keeping them: layers (each whole "
        "layer), mixer or ffn, comma-separated, each optionally :MIXER (only the layers whose "
        "mixer it is), e.g. layers, mixer,ffn, layers:attention (default: none)",
        Flag(type=recompute_value, metavar="WHAT", example="mixer,ffn"),
        resumable=True,
        checks=(Check(lambda v, _: _recompute_ok(v),
                      "layers, mixer or ffn, comma-separated, each optionally :MIXER"),),
    )  # fmt: skip
    adapter: str | None = option(
        None,
        "fine-tune a checkpoint through this adapter, its base frozen, e.g. lora(rank=8); "
        "the run's checkpoints hold the adapter alone with the base's identity (only with a "
        "checkpoint as the model: a spec takes the key adapter=)",
        Flag(metavar="ADAPTER", example="lora(rank=8)"),
        checks=(Check(lambda v, _: isinstance(v, str) and bool(v.strip()),
                      "an adapter, e.g. lora(rank=8)"),),
    )  # fmt: skip
    eval_bpb: bool = option(
        False,
        "evaluations also report bits per byte (val_bpb in metrics.jsonl): the loss in bits "
        "per UTF-8 byte of the validation text, comparable across tokenizers",
        Flag(action="store_true"),
        resumable=True,
    )
    loggers: tuple[str, ...] = option(
        (),
        "also log to this experiment tracker (repeatable; each needs its extra, e.g. pip "
        "install 'lmcore-registry[tensorboard]'); metrics.jsonl and loss.png are always written",
        Flag("--logger", action="append", choices=TRACKERS),
        resumable=True,
        checks=(among(TRACKERS),),
    )
    log_group: str | None = option(
        None,
        "the trackers' experiment (MLflow) and group (W&B) (default: lmcore; a sweep's "
        "directory name in a sweep)",
        Flag(metavar="NAME"),
        resumable=True,
    )

    def resolved(self, context_length: int, dtype: str = "float32") -> ResolvedConfig:
        """This config with `steps` (from `tokens`), `min_lr`, `warmup` and `decay_steps` set,
        checked (`TrainError` names the first bad option), and `dtype` when it names none (a
        checkpoint's own, say)."""
        self.check()
        steps = self.steps
        if self.tokens is not None:
            window = self.context or context_length
            steps = max(1, math.ceil(self.tokens / (self.batch_size * window)))
        out = dataclasses.replace(
            self,
            steps=steps,
            min_lr=self.lr / 10 if self.min_lr is None else self.min_lr,
            warmup=round(0.1 * steps) if self.warmup is None else self.warmup,
            decay_steps=steps if self.decay_steps is None else self.decay_steps,
        )
        out.check()
        values = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
        return ResolvedConfig(**{**values, "dtype": self.dtype or dtype})

    def check(self) -> None:
        """`TrainError` for the first option out of its range, named as on the command line."""
        options.check(self)

    def to_json(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    def given(self) -> dict[str, Any]:
        """The options that differ from the defaults, as `to_json` writes them."""
        default = TrainConfig().to_json()
        return {k: v for k, v in self.to_json().items() if v != default[k]}

    def cli_args(self) -> list[str]:
        """The `lmcore train` options that give this config (those that differ from the
        defaults); `TrainError` for an option the command line does not have."""
        return options.cli_args(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainConfig:
        return cls(**_json_values(cls, data))

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> TrainConfig:
        """The config of options as the command line (or a sweep file's `[train]`) gives them
        (`grad_clip` 0: no clipping)."""
        return cls.from_json(options.from_flags(values, cls))


@dataclass(frozen=True)
class ResolvedConfig(TrainConfig):
    """The config a run trains with (its run.json's `config`): `TrainConfig.resolved()`, with
    the derived options set."""

    min_lr: float = dataclasses.field(kw_only=True)
    warmup: int = dataclasses.field(kw_only=True)
    decay_steps: int = dataclasses.field(kw_only=True)
    dtype: str = dataclasses.field(kw_only=True)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResolvedConfig:
        unset = [k for k in ("min_lr", "warmup", "decay_steps", "dtype") if data.get(k) is None]
        if unset:
            raise TrainError(
                f"a run.json's config without {', '.join(unset)}: lmcore train writes every "
                "option of a run there; restore the file or start a new run"
            )
        return cls(**_json_values(cls, data))


def _json_values(cls: type[TrainConfig], data: Mapping[str, Any]) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise TrainError(f"unknown training options {', '.join(unknown)} in a run.json")
    values = dict(data)
    for opt in options.options(cls):  # JSON's lists back to tuples (betas, loggers)
        if isinstance(opt.default, tuple) and opt.name in values:
            values[opt.name] = tuple(values[opt.name])
    return values


# Options `lmcore train` takes on its command line, in `--help`'s order (`eps` and
# `decay_steps` it does not); those a resumed run may change (none changes the steps taken).
CLI_OPTIONS: Final = tuple(opt.name for opt, _ in options.flagged(TrainConfig))
RESUMABLE: Final = options.resumable(TrainConfig)


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
