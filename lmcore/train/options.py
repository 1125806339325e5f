"""How an option of a run is declared: once, as a field of its frozen config, with its default,
its help, its command-line form, whether a resumed run may change it, and its range.

    @dataclass(frozen=True)
    class TrainConfig:
        lr: float = option(
            1e-3,
            "peak learning rate (default: {default:g})",   # --help's, `default` filled in
            Flag(type=float, metavar="LR"),                # --lr LR; None: no flag
            resumable=False,                               # a resumed run may not change it
            checks=(Check(lambda v, config: v > 0, "a number > 0"),),
        )

Everything else is read from these declarations: the flags of `lmcore train` and `lmcore sweep`
(`add_flags`), a config's own command line (`cli_args`), the options read from parsed flags
(`given`, `from_flags`), the options a resumed run may change (`resumable`), the range checks
(`check`) and the keys of a sweep file's `[train]` table (`flagged`). No torch here, and no
lmcore.cli: the command line reads the defaults without importing either.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from lmcore.errors import TrainError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "Check",
    "Flag",
    "Option",
    "add_flags",
    "among",
    "check",
    "cli_args",
    "count",
    "flagged",
    "from_flags",
    "given",
    "option",
    "options",
    "positive",
    "replaced",
    "resumable",
    "seed_value",
    "to_flags",
]

T = TypeVar("T")
C = TypeVar("C", bound="DataclassInstance")
_KEY = "lmcore.option"  # the key of a field's metadata that holds its declaration


# ------------------------------------------------------------------------------ parsers


def positive(text: str) -> int:
    """argparse's type for a count: 1 or more, at most 19 digits."""
    value = int(text) if re.fullmatch(r"\s*\+?\d{1,19}\s*", text) else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seed_value(text: str) -> int:
    """argparse's type for a seed: 0 .. 2**64-1, as torch takes it."""
    value = int(text) if re.fullmatch(r"\s*\+?\d{1,20}\s*", text) else -1
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer in 0 .. 2**64-1, got {text!r}")
    return value


# ------------------------------------------------------------------------------ declarations


@dataclass(frozen=True)
class Check:
    """A range an option's value must be in: `ok(value, config)`. Out of it, the error reads
    `--NAME VALUE: must be WHAT`, with the config's fields filled into WHAT (`"in [0, lr={lr}]"`).
    None (an option not set) is never checked; a repeatable flag's options are checked one by
    one."""

    ok: Callable[[Any, Any], bool]
    what: str


def count(least: int) -> Check:
    """An integer (not a float) of at least `least`."""
    what = "a positive integer" if least == 1 else f"an integer ≥ {least}"
    return Check(lambda v, _: isinstance(v, int) and v >= least, what)


def among(choices: Iterable[str]) -> Check:
    """One of `choices`, named in their order."""
    names = tuple(choices)
    return Check(lambda v, _: v in names, f"one of {', '.join(names)}")


@dataclass(frozen=True)
class Flag:
    """An option's command-line form, as argparse spells it; `dest` is the option's name.

    `name`: the flag (default `--the-option-name`). `action`: `store` (`--lr LR`; `nargs` values
    make a tuple, `--betas B1 B2`), `store_const` (`--bf16` sets `const`), `store_true`
    (`--compile`) or `append` (`--logger NAME`, repeatable, a tuple). `off`: the value that
    stands for None (`--grad-clip 0`). `exclusive`: flags sharing this name exclude each other
    (`--steps | --tokens`), and of those a config sets the last one wins (tokens give the
    steps). `after`: the option whose flag this one's follows in `--help` (otherwise: the
    declaration order). `example`: a value as typed, other than the default (for an option
    whose values have a grammar of their own)."""

    name: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | tuple[str, ...] | None = None
    nargs: int | None = None
    choices: tuple[str, ...] | None = None
    action: Literal["store", "store_const", "store_true", "append"] = "store"
    const: Any = None
    off: Any = None
    exclusive: str | None = None
    after: str | None = None
    example: str | None = None  # a value other than the default, for tests and docs


@dataclass(frozen=True)
class _Declared:
    help: str
    flag: Flag | None
    resumable: bool
    checks: tuple[Check, ...]


def option(
    default: T,
    help: str,
    flag: Flag | None = None,
    *,
    resumable: bool = False,
    checks: tuple[Check, ...] = (),
) -> T:
    """A config field declaring an option: its `default`; its `help` (`{default}` is filled
    in); its `flag` (None: the command line does not take it); `resumable`: a resumed run may
    change it (it changes none of the steps already taken); `checks`: its range, in order."""
    declared = _Declared(help, flag, resumable, checks)
    field: T = dataclasses.field(default=default, metadata={_KEY: declared})
    return field


@dataclass(frozen=True)
class Option:
    """One declared option of a config, as `options(cls)` reads it."""

    name: str
    default: Any
    help: str
    flag: Flag | None
    resumable: bool
    checks: tuple[Check, ...]

    @property
    def dashed(self) -> str:
        """`--batch-size` for `batch_size`: the name errors give the option."""
        return f"--{self.name.replace('_', '-')}"

    @property
    def help_text(self) -> str:
        return self.help.format(default=self.default)

    @property
    def may_be_none(self) -> bool:
        """Whether None is a value of it (not set, or its flag's `off`) rather than an error."""
        return self.default is None or (self.flag is not None and self.flag.off is not None)


def options(cls: type) -> tuple[Option, ...]:
    """The options `cls` (a dataclass, or a subclass of one) declares, in field order."""
    found = []
    for f in dataclasses.fields(cls):
        for c in cls.__mro__:  # a subclass may narrow a field's type (`ResolvedConfig`)
            declared: dataclasses.Field[Any] | None = getattr(c, "__dataclass_fields__", {}).get(
                f.name
            )
            if declared is not None and isinstance(d := declared.metadata.get(_KEY), _Declared):
                found.append(Option(f.name, declared.default, d.help, d.flag, d.resumable,
                                    d.checks))  # fmt: skip
                break
    return tuple(found)


def flagged(cls: type) -> tuple[tuple[Option, Flag], ...]:
    """The options of `cls` that have a flag, with it, in `--help`'s order."""
    out = [(o, o.flag) for o in options(cls) if o.flag is not None]
    for item in [item for item in out if item[1].after is not None]:
        out.remove(item)
        names = [o.name for o, _ in out]
        if item[1].after not in names:
            raise TrainError(
                f"{cls.__name__}.{item[0].name}: its flag is to follow {item[1].after!r}'s, "
                "which has none"
            )
        out.insert(names.index(item[1].after) + 1, item)
    return tuple(out)


def flag_name(opt: Option, flag: Flag) -> str:
    return flag.name or opt.dashed


def resumable(cls: type) -> tuple[str, ...]:
    """The names of the options of `cls` a resumed run may change."""
    return tuple(o.name for o in options(cls) if o.resumable)


# ------------------------------------------------------------------------------ derived


class _Fields:
    """A config's fields for `str.format_map`."""

    def __init__(self, config: Any):
        self.config = config

    def __getitem__(self, key: str) -> Any:
        return getattr(self.config, key)


def check(config: Any) -> None:
    """`TrainError` for the first option of `config` out of its range, in declaration order,
    named as on the command line: `--lr -1: must be a number > 0, e.g. 1e-3`. A repeatable
    flag's values are checked one by one, under the flag's name (`--logger x`)."""
    for opt in options(type(config)):
        value = getattr(config, opt.name)
        if value is None and opt.may_be_none:
            continue
        name, values = opt.dashed, (value,)
        if opt.flag is not None and opt.flag.action == "append":
            name, values = flag_name(opt, opt.flag), value
        for v in values:
            for c in opt.checks:
                if not c.ok(v, config):
                    shown = " ".join(map(str, v)) if isinstance(v, tuple | list) else v
                    what = c.what.format_map(_Fields(config))
                    raise TrainError(f"{name} {shown}: must be {what}")


def cli_args(config: Any, command: str = "lmcore train") -> list[str]:
    """The command-line options that give `config` (those that differ from the defaults);
    `TrainError` for an option the command line does not have."""
    opts = options(type(config))
    changed = [o for o in opts if getattr(config, o.name) != o.default]
    args: list[str] = []
    for opt in changed:
        value, flag = getattr(config, opt.name), opt.flag
        if flag is None:
            takes = ", ".join(o.name for o, _ in flagged(type(config)))
            raise TrainError(
                f"{opt.name}={value}: {command} has no option for it (it takes {takes}); "
                f"leave it at its default {opt.default}"
            )
        if flag.exclusive and any(getattr(config, o.name) for o in _later(opts, opt)):
            continue  # a later one of its group, set, gives it (tokens give the steps)
        name = flag_name(opt, flag)
        if flag.action in ("store_const", "store_true"):
            args.append(name)
        elif flag.action == "append":
            args += [a for v in value for a in (name, _text(v))]
        elif flag.nargs is not None:
            args += [name, *map(_text, value)]
        else:
            args += [name, _text(flag.off if value is None else value)]
    return args


def replaced(config: C, updates: Mapping[str, Any]) -> C:
    """`config` with `updates`; an option of an exclusive group given resets the later ones not
    given to their defaults (`--steps` on a run that had `--tokens` trains for those steps)."""
    opts = options(type(config))
    reset = {
        o.name: o.default
        for given_opt in opts if given_opt.name in updates
        for o in _later(opts, given_opt) if o.name not in updates
    }  # fmt: skip
    return dataclasses.replace(config, **{**reset, **updates})


def _later(opts: tuple[Option, ...], opt: Option) -> list[Option]:
    """The options after `opt` in its exclusive group."""
    group = opt.flag.exclusive if opt.flag is not None else None
    rest = opts[opts.index(opt) + 1 :]
    return [o for o in rest if group and o.flag is not None and o.flag.exclusive == group]


def _text(value: Any) -> str:
    """A value as the command line writes it: floats in full (`repr`), the rest as `str`."""
    return repr(value) if isinstance(value, float) else str(value)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """The flags of the options of `cls` on `parser`, each defaulting to None (not given)."""
    groups: dict[str, Any] = {}
    for opt, flag in flagged(cls):
        where: Any = parser
        if flag.exclusive is not None:
            if flag.exclusive not in groups:
                groups[flag.exclusive] = parser.add_mutually_exclusive_group()
            where = groups[flag.exclusive]
        kwargs: dict[str, Any] = {"help": opt.help_text.replace("%", "%%")}  # argparse's escape
        if flag.action == "store_true":
            kwargs.update(action="store_true", default=None)
        elif flag.action == "store_const":
            kwargs.update(action="store_const", const=flag.const)
        else:
            if flag.action == "append":
                kwargs["action"] = "append"
            for key in ("type", "metavar", "nargs", "choices"):
                if getattr(flag, key) is not None:
                    kwargs[key] = getattr(flag, key)
        if flag_name(opt, flag) != opt.dashed:
            kwargs["dest"] = opt.name
        where.add_argument(flag_name(opt, flag), **kwargs)


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The options of `cls` given on the command line parsed into `args`, as the flags give
    them (several values as a tuple; `off` as it is, `grad_clip` 0), in `--help`'s order."""
    out = {}
    for opt, _ in flagged(cls):
        value = getattr(args, opt.name, None)
        if value is not None:
            out[opt.name] = tuple(value) if isinstance(value, list) else value
    return out


def from_flags(values: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """Options as the command line (or a sweep file's `[train]`) gives them, as the fields of
    `cls`: a flag's `off` value is None (`grad_clip` 0: no clipping), a list a tuple."""
    out = dict(values)
    for opt, flag in flagged(cls):
        if opt.name in out:
            if flag.off is not None and out[opt.name] == flag.off:
                out[opt.name] = None
            elif isinstance(out[opt.name], list):
                out[opt.name] = tuple(out[opt.name])
    return out


def to_flags(values: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """`from_flags` undone, for a sweep file's `[train]`: None as its flag's `off` (`grad_clip =
    0`), a tuple as a list."""
    offs = {opt.name: flag.off for opt, flag in flagged(cls) if flag.off is not None}
    out = {k: offs[k] if v is None and k in offs else v for k, v in values.items()}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
