"""Where each value of a spec was written, and the `SpecError` that points there.

A value comes from the user's text or from its preset's. An error at the user's value puts the
caret under it; one at a preset's value puts it under the preset's name and says which of the
preset's keys it is. `Origins` holds, for one resolution, the item of each key, the per-layer
items, the preset item and the item that gave each layer its value; it reads a model key's value
from its item, so that a bad value is blamed where it was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmcore.components import Arg
from lmcore.errors import SpecError, ValueProblem, one_of
from lmcore.registry import Registry
from lmcore.spec import KEY_ARGS
from lmcore.syntax import Item


@dataclass(frozen=True)
class Origin:
    """Where a value was written: the user's spec, or (`preset` set) a preset's text."""

    text: str
    item: Item
    preset: Item | None = None  # the user's preset item, when `text` is that preset's


class Origins:
    """The items of one spec and its preset by key, and every `SpecError` placed at one."""

    def __init__(self, text: str, registry: Registry):
        self.text = text
        self.registry = registry
        self.values: dict[str, Origin] = {}  # the preset's items, overridden by the user's
        self.layered: dict[str, list[Origin]] = {}  # key[layers]=value items, the preset's first
        self.preset_item: Item | None = None
        self.blame: dict[tuple[str, int], Origin] = {}  # (key, layer): the item that set it

    def fail(self, message: str, origin: Origin, start: int = -1, end: int = -1) -> SpecError:
        """A SpecError at the whole value of `origin` (or at `start:end` within the user's text);
        a value from a preset points at the preset's name instead."""
        if origin.preset is not None:
            key = origin.item.key
            if origin.item.layers is not None:
                key = f"{key}[...]"
            message = f"{message} [from preset {origin.preset.value.name!r}: {key}=...]"
            return SpecError(message, self.text, origin.preset.start, origin.preset.end)
        if start < 0:
            start, end = origin.item.value.start, origin.item.value.end
        return SpecError(message, origin.text, start, end)

    def at_slot(self, key: str, message: str, layers: Sequence[int] = ()) -> SpecError:
        """Blame the per-layer item that gave `key` to `layers[0]`, else `key`'s value, else the
        preset, else the whole spec."""
        if layers and (key, layers[0]) in self.blame:
            return self.fail(message, self.blame[key, layers[0]])
        if key in self.values:
            return self.fail(message, self.values[key])
        if key in self.layered:
            return self.fail(message, self.layered[key][0])
        where = self.preset_item
        span = (where.start, where.end) if where else (0, len(self.text))
        return SpecError(message, self.text, *span)

    def malformed(self, preset: Item, problem: str) -> SpecError:
        """A SpecError at the preset's name: its text cannot be read as a preset's."""
        value = preset.value
        entry = self.registry.get_preset(value.name or "", value.provider)
        return SpecError(
            f"preset {value.name!r} from {entry.provenance} is malformed: {problem}",
            self.text,
            value.start,
            value.end,
        )

    def by_user(self, key: str) -> bool:
        return key in self.values and self.values[key].preset is None

    # ---------------------------------------------------------------- model keys

    def model_key(self, arg: Arg) -> Any:
        """The checked value of model key `arg`, its default when the spec gives none."""
        origin = self.values.get(arg.name)
        if origin is None:
            if arg.required:
                raise self.at_slot(
                    arg.name,
                    f"missing {arg.name} ({arg.help}); add {arg.name}=... or start with a preset: "
                    f"{one_of(self.registry.preset_names())}",
                )
            return arg.default
        return self.check_key(arg, origin)

    def check_key(self, arg: Arg, origin: Origin) -> Any:
        """The value `origin` writes, checked as model key `arg`'s."""
        value = origin.item.value
        if value.scalar is None and not value.is_plain_name:
            raise self.fail(f"{arg.name} takes a plain {arg.type_name}, not a component", origin)
        try:
            return arg.check(value.scalar if value.scalar is not None else value.name)
        except ValueProblem as e:
            raise self.fail(f"{arg.name} {e}", origin) from None

    def given(self, key: str, derived: Any) -> Any:
        """`key`'s value when the spec gives it, else `derived`."""
        origin = self.values.get(key)
        return derived if origin is None else self.check_key(KEY_ARGS[key], origin)
