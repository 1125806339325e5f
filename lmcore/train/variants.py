"""What a sweep's `--vary` changes: the model, or the training recipe of the variant's runs.

    change = split_change("optimizer=torch_adamw, norm=none")
    change.spec     # "norm=none": items that take the place of the base spec's
    change.train    # {"optimizer": "torch_adamw"}: the runs' training options, as flags give them

The rule, decided here and nowhere else: a key of the model spec (`lmcore.spec.ALL_KEYS`)
changes the model; a key of `RECIPE_KEYS` (the optimizer, the schedule and the training
options that shape how the same tokens are learnt from) changes the variant's training config.
The two sets are disjoint (`tests/train/test_variants.py` holds them so), so no key means both:
should a model key ever take a recipe key's name, the model's wins and the recipe's is given
as the option of the whole sweep. The other training options (the budget, the batch size, the
seed, evaluation, the device) belong to the sweep: every variant shares them, so the runs of one
seed stay paired and every variant trains the same tokens; `--vary steps=10` is refused saying
so. Any other key is unknown, with a did-you-mean over both sets.

A recipe value is written as its `lmcore train` flag takes it, quoted when it holds a comma, a
space or `=`: `lr=3e-3`, `schedule=wsd(decay=0.1)`, `grad_clip=0` (no clipping),
`decay="matrix,gain"`, `betas="0.9 0.99"`, `role_lr="embedding=2 head=0.5"` (the values of a
two-valued or repeatable flag separated by spaces; `role_lr=none` for no multipliers).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from lmcore.errors import SpecError, TrainError, did_you_mean
from lmcore.spec import ALL_KEYS
from lmcore.syntax import Item
from lmcore.train.config import CLI_OPTIONS, TrainConfig
from lmcore.train.options import Flag, Option, flagged, from_flags

if TYPE_CHECKING:
    from lmcore.registry import Registry
    from lmcore.train.config import ResolvedConfig
    from lmcore.train.recipe import Recipe

__all__ = ["RECIPE_KEYS", "SHARED_KEYS", "Change", "check_recipe", "recipe_text", "split_change"]

# The training options a variant may change, in `lmcore train --help`'s order; each has a flag
# (a run elsewhere is an `lmcore train` command), none changes the tokens a run sees.
RECIPE_KEYS: Final = ("lr", "min_lr", "warmup", "weight_decay", "betas", "optimizer", "schedule",
                      "decay", "role_lr", "grad_clip")  # fmt: skip
# The training options every variant of a sweep shares: given to the sweep, not to a variant.
SHARED_KEYS: Final = tuple(k for k in CLI_OPTIONS if k not in RECIPE_KEYS)


@dataclass(frozen=True)
class Change:
    """One `--vary` split by the rule above: the model's items (`key=value, ...` as written, or
    empty) and the recipe's options (`TrainConfig` fields, as the flags give them)."""

    text: str
    spec: str
    train: Mapping[str, Any] = field(default_factory=dict)
    # where each recipe value lies in `text` (its start, and 1 when quoted), for the caret
    spans: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    def config(self, base: TrainConfig) -> TrainConfig:
        """`base` with this change's recipe options in place of its own."""
        return dataclasses.replace(base, **from_flags(self.train, TrainConfig))


def _flags() -> dict[str, tuple[Option, Flag]]:
    return {o.name: (o, f) for o, f in flagged(TrainConfig)}


def _error(change: str, item: Item, message: str) -> SpecError:
    return SpecError(f"--vary {change!r}: {message}", change, item.start, item.value.end)


def split_change(change: str) -> Change:
    """`change` (`key=value, ...`) split into the model's items and the recipe's options, each
    recipe value read as its flag reads it; a `SpecError` with a caret for an unknown key (a
    did-you-mean over the model's and the recipe's keys), a training option the variants share,
    or a value its flag refuses."""
    from lmcore.spec import parse_items

    try:
        items = parse_items(change)
    except SpecError as e:
        raise SpecError(f"--vary {change!r}: {e.message}", e.spec, e.start, e.end) from None
    flags = _flags()
    spec: list[str] = []
    train: dict[str, Any] = {}
    spans: dict[str, tuple[int, int, int]] = {}
    for item in items:
        key = item.key
        if key is None:
            raise _error(change, item, f"{change[item.start : item.end]!r} is not a key=value "
                         "item; a variant changes keys of the base spec or of its recipe, e.g. "
                         "--vary norm=none or --vary optimizer=torch_adamw (a preset belongs in "
                         "the base spec)")  # fmt: skip
        if key in ALL_KEYS:  # the model's key wins (the sets are disjoint: a test says so)
            spec.append(change[item.start : item.value.end])
            continue
        if key in SHARED_KEYS:
            opt, flag = flags[key]
            raise _error(change, item, f"{key} is a training option every variant shares (the "
                         "budget, the batches and the evaluation are the same for all, so the "
                         f"runs stay paired): give it to the sweep as {flag.name or opt.dashed}; "
                         f"a variant may change {', '.join(RECIPE_KEYS)} or the model's "
                         "keys")  # fmt: skip
        if key not in RECIPE_KEYS:
            raise _error(change, item, f"unknown key {key!r}"
                         f"{did_you_mean(key, (*ALL_KEYS, *RECIPE_KEYS))}; a variant changes the "
                         f"model's keys ({', '.join(ALL_KEYS)}) or the recipe's "
                         f"({', '.join(RECIPE_KEYS)})")  # fmt: skip
        if item.layers is not None:
            raise _error(change, item, f"{key} is a training option: one value for the whole "
                         "run, not by layer")  # fmt: skip
        if key in train:
            raise _error(change, item, f"{key} is given twice; keep one")
        quoted = isinstance(item.value.scalar, str)
        text = item.value.scalar if quoted else change[item.value.start : item.value.end]
        train[key] = _read(change, item, key, str(text), *flags[key])
        spans[key] = (item.value.start, item.value.end, int(quoted))
    return Change(change, ", ".join(spec), train, spans)


def _read(change: str, item: Item, key: str, text: str, opt: Option, flag: Flag) -> Any:
    """`text` as `flag` reads it: several values (separated by spaces) for a two-valued or
    repeatable flag."""
    parse = flag.type or str
    many = flag.nargs is not None or flag.action == "append"
    words = text.split() if many else [text]
    if flag.action == "append" and words in ([], ["none"]):
        return []
    if flag.nargs is not None and len(words) != flag.nargs:
        example = " ".join(map(str, opt.default))
        raise _error(change, item, f"{key} takes {flag.nargs} values separated by a space, "
                     f"quoted: {key}=\"{example}\"; got {text!r}")  # fmt: skip
    values = []
    for word in words:
        try:
            values.append(parse(word))
        except argparse.ArgumentTypeError as e:
            raise _error(change, item, f"{key}={word}: {e}") from None
        except ValueError:
            what = "a number" if parse is float else "an integer" if parse is int else "a value"
            raise _error(change, item, f"{key} takes {what}, as {flag.name or opt.dashed} "
                         f"does; got {word!r}") from None  # fmt: skip
    return values if many else values[0]


def check_recipe(
    change: Change | None,
    config: TrainConfig,
    context_length: int,
    registry: Registry | None = None,
) -> tuple[ResolvedConfig, Recipe]:
    """The variant's config (`change` applied to `config`; None: the baseline's) resolved for
    `context_length` and its recipe resolved through the registry, before any run starts: a
    `TrainError` (a `SpecError` with a caret for an optimizer or schedule the registry does not
    resolve) names the `--vary` token, or for the baseline the option."""
    from lmcore.train.recipe import Recipe, check_offer, resolve_recipe

    where = "" if change is None else f"--vary {change.text!r}: "
    cfg = config if change is None else change.config(config)
    parts = []
    for kind in ("optimizer", "schedule"):
        text = getattr(cfg, kind)
        try:
            parts.append(resolve_recipe(kind, text, registry))
        except SpecError as e:
            if change is None or kind not in change.train:  # the sweep's own --optimizer
                raise TrainError(f"--{kind} {text}: {e}") from None
            start, _, quoted = change.spans[kind]
            shift = start + quoted + len(text) - len(text.lstrip())
            raise SpecError(f"{where}{kind} {text.strip()!r}: {e.message}", change.text,
                            shift + e.start, shift + e.end) from None  # fmt: skip
    recipe = Recipe(*parts)
    default = TrainConfig()
    try:
        resolved = cfg.resolved(context_length)
        check_offer(recipe.optimizer, "betas", cfg.betas, default.betas)
        check_offer(recipe.optimizer, "eps", cfg.eps, default.eps)
    except TrainError as e:
        raise TrainError(f"{where}{e}") from None
    return resolved, recipe


def recipe_text(recipe: Recipe) -> str:
    """`optimizer · schedule`, each as its canonical spec: what the tables show of a recipe."""
    return f"{recipe.optimizer.spec} · {recipe.schedule.spec}"
