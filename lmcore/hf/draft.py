"""What the rules of a Hugging Face family's table work on (`lmcore.hf.rules`): a `Draft` of
the spec values a config.json gives, read field by field, and a `SpecView` of a resolved model
to write one from; the `Rule` protocol they share.

A spec *path* is a model key (`d_model`, `window`) or a component slot and its argument
(`ffn`, `ffn.bias`, `pos.theta`, `qk_norm.eps`); a rule may give one value for the whole model
or a list of per-layer values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from lmcore.blueprint import Blueprint
from lmcore.hf.values import json_text as _json

__all__ = ["OMIT", "SLOTS", "Draft", "Rule", "SpecView", "paths"]

# Component slots a path may name (their arguments after a dot).
SLOTS: Final = ("block", "norm", "ffn", "pos", "mixer", "attn", "qk_norm")
OMIT: Final = object()  # a default that is not given


class Draft:
    """What a config says, as spec values: `values` by spec path (a value, or a list of one
    value per layer), the `problems` found (each names its field) and `notes` (what is kept
    but not applied, e.g. dropout). Rules read fields with `field`, which records them as
    read, and set values with `set`, which names two fields that disagree."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = config
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.problems: list[str] = []
        self.notes: list[str] = []

    def field(self, name: str, default: Any = None) -> Any:
        """Config field `name`; `default` when it is absent or null."""
        value = self.config.get(name)
        return default if value is None else value

    def set(self, path: str, value: Any, source: str) -> None:
        if path in self.values and self.values[path] != value and self.sources[path] != source:
            self.problems.append(
                f"{source} and {self.sources[path]} disagree (one gives {path}="
                f"{_json(value)}, the other {_json(self.values[path])})"
            )
            return
        self.values[path] = value
        self.sources[path] = source

    @property
    def num_layers(self) -> int | None:
        n = self.values.get("num_layers")
        return n if isinstance(n, int) else None


class SpecView:
    """A resolved model as the rules write it: the value of a spec path at each layer (`None`
    where that layer's slot has no such argument), and the `base` config (the one a checkpoint
    was converted from) whose spelling a rule keeps when it says the same."""

    def __init__(self, bp: Blueprint, base: Mapping[str, Any]):
        self.bp, self.spec, self.base = bp, bp.spec, base
        self.n = bp.spec.num_layers

    def at(self, path: str, layer: int) -> Any:
        slot, _, arg = path.partition(".")
        lbp = self.bp.layer(layer)
        if slot not in SLOTS:
            return getattr(lbp.spec, slot)
        part = lbp.parts.get(slot)
        if part is None:
            return None
        return part.name if not arg else lbp.kwargs(slot).get(arg)

    def layers(self, path: str) -> list[Any]:
        return [self.at(path, i) for i in range(self.n)]

    def first(self, path: str) -> Any:
        """The value of the first layer that has one (the whole model's, when uniform)."""
        slot = path.partition(".")[0]
        if slot == "norm" or slot not in SLOTS:  # whole-model values: ln_final's norm
            whole = self.bp.parts.get(slot) if slot in SLOTS else None
            if slot not in SLOTS:
                return getattr(self.spec, slot)
            arg = path.partition(".")[2]
            return None if whole is None else (self.bp.kwargs(slot).get(arg) if arg else whole.name)
        return next((v for v in self.layers(path) if v is not None), None)

    def keep(self, name: str, value: Any, reads: Callable[[Any], Any] = lambda v: v) -> Any:
        """`value` for config field `name`, or the base config's own spelling of it when that
        reads as the same spec value (`4096` for `4096.0`, `null` head_dim for the default)."""
        if name in self.base:
            try:
                if reads(self.base[name]) == value:
                    return self.base[name]
            except (TypeError, ValueError, ArithmeticError):
                pass
        return value


class Rule(Protocol):
    """Config fields and the spec values they give, both ways."""

    @property
    def fields(self) -> tuple[str, ...]: ...

    def read(self, d: Draft) -> None: ...

    def write(self, v: SpecView, out: dict[str, Any]) -> None: ...


def paths(spec: str | tuple[str, ...]) -> tuple[str, ...]:
    return (spec,) if isinstance(spec, str) else spec
