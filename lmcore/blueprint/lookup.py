"""Each component a spec names, looked up in the registry and resolved into a `Part`: its
arguments checked against its declaration, nested components resolved the same way, defaults
filled in, the canonical spec written."""

from __future__ import annotations

from typing import Any

from lmcore.blueprint.derived import width
from lmcore.blueprint.origins import Origin, Origins
from lmcore.blueprint.resolved import SLOT_KINDS
from lmcore.components import Arg, Component, format_scalar
from lmcore.errors import RegistryError, SpecError, ValueProblem, clip, did_you_mean, one_of
from lmcore.parts import Part
from lmcore.registry import Registry
from lmcore.spec import SLOTS, ComponentSpec
from lmcore.syntax import Value, parse_value


class PartLookup:
    """The parts of one resolution, looked up in `registry`; errors placed by `origins`."""

    def __init__(self, registry: Registry, origins: Origins):
        self.registry = registry
        self.origins = origins

    def slot(self, slot: str) -> Part:
        """The part filling `slot`: its entry and every argument checked, defaults filled in.
        An ffn's `d_ff` argument is left to the model's `d_ff` (`lmcore.blueprint.derived`)."""
        origin = self.origins.values.get(slot)
        value = Value(0, 0, name=SLOTS[slot], args=()) if origin is None else origin.item.value
        return self.part(SLOT_KINDS[slot], value, origin, slot)

    def qk_norm(self, origin: Origin | None) -> Part | None:
        return self.optional("norm", origin, "qk_norm")

    def optional(self, kind: str, origin: Origin | None, label: str) -> Part | None:
        """The part a key that may be `none` names (`qk_norm`, `adapter`), or None."""
        if origin is None or (origin.item.value.is_plain_name and origin.item.value.name == "none"):
            return None
        return self.part(kind, origin.item.value, origin, label)

    def part(
        self, kind: str, value: Value, origin: Origin | None, label: str, depth: int = 0
    ) -> Part:
        """`value` resolved as a component of `kind` (`label` names its place in messages):
        the registry entry, each argument checked against the declaration (nested components
        resolved the same way), defaults filled in. The canonical spec leaves out an argument
        declared ``written="changed"`` while it has its default; a top-level ffn's `d_ff`
        belongs to the model (`d_ff`), a nested one's stays with it."""

        def fail(message: str, start: int = -1, end: int = -1) -> SpecError:
            if origin is None:
                return SpecError(message)
            if start < 0:
                start, end = value.start, value.end
            return self.origins.fail(message, origin, start, end)

        if value.name is None:
            shown = format_scalar(value.scalar) if value.scalar is not None else ""
            example = SLOTS.get(label, "name")
            raise fail(
                f"{label} takes a component, e.g. {label}={example} or "
                f"{label}=name(arg=value); got {clip(shown)}; "
                f"available {kind}: {one_of(self.registry.names(kind))}"
            )
        try:
            entry = self.registry.get(kind, value.name, value.provider)
        except RegistryError as e:
            if origin is None:
                raise SpecError(f"default {kind} {value.name!r} is unavailable: {e}") from e
            raise fail(str(e)) from e
        comp = entry.component
        declared = {a.name: a for a in comp.args}
        given = {name: (raw, start, end) for name, raw, start, end in value.args or ()}
        # An ffn also takes its width, d_ff (no component declares it: lmcore passes it).
        accepted = [*declared, "d_ff"] if kind == "ffn" else list(declared)
        for name, (_, start, end) in given.items():
            if name not in accepted:
                raise fail(
                    f"{kind} {comp.name!r} has no argument {clip(name)}"
                    f"{did_you_mean(name, accepted)}; it takes: {one_of(accepted)}",
                    start,
                    end,
                )
        values: list[tuple[str, Any]] = []
        written: list[tuple[str, Any]] = []
        for a in comp.args:
            if a.name in given:
                raw, start, end = given[a.name]
                got, canon = self.argument(kind, comp, a, raw, origin, start, end, depth)
                if (
                    a.written == "changed"
                    and canon == self.default_arg(kind, comp, a, value, origin, depth)[1]
                ):
                    values.append((a.name, got))
                    continue
            elif a.required:
                raise fail(
                    f"{kind} {comp.name!r} needs argument {a.name!r} "
                    f"({a.type_name}: {a.help}); write {label}={comp.name}({a.name}=...)"
                )
            else:
                got, canon = self.default_arg(kind, comp, a, value, origin, depth)
                if a.written == "changed":
                    values.append((a.name, got))
                    continue
            values.append((a.name, got))
            written.append((a.name, canon))
        if depth > 0 and "d_ff" in given:
            raw, start, end = given["d_ff"]
            if isinstance(raw, Value):
                raise fail(
                    f"argument 'd_ff' of {kind} {comp.name!r} takes an int, not a component",
                    start,
                    end,
                )
            try:
                d_ff = width(raw)
            except ValueProblem as e:
                raise fail(f"argument 'd_ff' of {kind} {comp.name!r} {e}", start, end) from None
            values.append(("d_ff", d_ff))
            written.append(("d_ff", d_ff))
        ambiguous = self.registry.is_ambiguous(kind, comp.name)
        provider = entry.provenance.qualifier if ambiguous else None
        return Part(ComponentSpec(comp.name, tuple(written), provider), entry, tuple(values))

    def argument(
        self,
        kind: str,
        comp: Component,
        a: Arg,
        raw: Any,
        origin: Origin | None,
        start: int,
        end: int,
        depth: int,
    ) -> tuple[Any, Any]:
        """`(value for the factory, canonical value)` of argument `a` as written."""
        where = f"argument {a.name!r} of {kind} {comp.name!r}"

        def fail(message: str) -> SpecError:
            if origin is None:
                return SpecError(message)
            return self.origins.fail(message, origin, start, end)

        if a.kind is None:
            if isinstance(raw, Value):
                raise fail(f"{where} expects {a.type_name}, got a component")
            try:
                checked = a.check(raw)
            except ValueProblem as err:
                raise fail(f"{where} {err}") from None
            return checked, checked
        if isinstance(raw, Value):
            sub = raw
        elif isinstance(raw, str):
            if raw == "none" and a.default is None:
                return None, None
            sub = Value(end - len(raw), end, name=raw)
        else:
            raise fail(
                f"{where} takes a {a.kind} component, e.g. {a.name}=name or name(arg=value); "
                f"got {format_scalar(raw)}"
            )
        part = self.part(a.kind, sub, origin, where, depth + 1)
        return part, part.spec

    def default_arg(
        self, kind: str, comp: Component, a: Arg, value: Value, origin: Origin | None, depth: int
    ) -> tuple[Any, Any]:
        """`(value for the factory, canonical value)` of argument `a`'s default; a component
        default is spec text, resolved here (its errors point at the component using it)."""
        if a.kind is None:
            checked = a.check(a.default)  # a plugin's defaults were checked when it loaded
            return checked, checked
        if a.default is None:
            return None, None
        where = f"the default of argument {a.name!r} of {kind} {comp.name!r}, {a.default!r}"
        try:
            parsed = parse_value(a.default)
        except SpecError as e:
            message = f"{where}, is malformed: {e.message}"
            raise (self.origins.fail(message, origin) if origin else SpecError(message)) from e
        part = self.part(a.kind, _moved(parsed, value.start, value.end), origin, where, depth + 1)
        return part, part.spec


def _moved(value: Value, start: int, end: int) -> Value:
    """`value` with every position set to `start:end` (a default's text is not the spec's)."""
    args = None
    if value.args is not None:
        args = tuple(
            (name, _moved(v, start, end) if isinstance(v, Value) else v, start, end)
            for name, v, _, _ in value.args
        )
    return value._replace(start=start, end=end, args=args)
