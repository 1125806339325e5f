"""From a spec to the resolved model: `resolve(spec) -> Blueprint`, done once and passed on.

A `Blueprint` is the canonical `ModelSpec` plus, for each component slot (`block`, `norm`, `ffn`,
`pos`, `attn`, and `qk_norm` when there is one), the `Part` that fills it: the registry entry
(with provenance) and every argument's value, nested components resolved too. Everything
downstream (the model, accounting and `describe`, the runner, the CLI, the conformance kit)
takes a blueprint and never parses a spec again. `kwargs(slot)` is the one rule for what a
component's factory and declarations receive; `layer(i)` is the blueprint of layer `i` alone.

Resolution, in order: parse the items (`lmcore.spec`); expand the preset; look up each component
and check its arguments against its declaration (nested components against theirs); derive
`num_kv_heads`, `head_dim`, `d_ff` and the query scale; apply the per-layer items
(`key[layers]=value`) and choose the canonical whole-model value of each key that differs by
layer; check the shape of every distinct layer against each component's `validate` and the
attention kernel's features. Every failure is a `SpecError` with a caret under the token to
blame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from lmcore.components import Arg, Component, format_scalar
from lmcore.errors import (
    PluginError,
    RegistryError,
    SpecError,
    SpecTypeError,
    clip,
    did_you_mean,
    one_of,
)
from lmcore.parts import Part, checked_module
from lmcore.registry import Entry, Provenance, Registry, get_registry
from lmcore.spec import (
    ALL_KEYS,
    KEY_ARGS,
    LAYER_KEYS,
    MAX_INT,
    MAX_LAYERED,
    SLOTS,
    ComponentSpec,
    Item,
    LayerValue,
    ModelSpec,
    Value,
    canonical_base,
    default_query_scale,
    format_layers,
    layer_groups,
    parse_items,
    parse_value,
)

__all__ = ["Blueprint", "Part", "checked_module", "divisors_near", "parse_spec", "resolve"]

# The kind of component each slot holds; `qk_norm` is a norm.
SLOT_KINDS: Mapping[str, str] = {**{slot: slot for slot in SLOTS}, "qk_norm": "norm"}


@dataclass(frozen=True)
class Blueprint:
    """A spec resolved against a registry: the canonical spec and the part filling each slot.

    `parts` holds the whole-model parts (and `ln_final`'s norm); `layer_parts` the component
    values some layers have instead, as `spec.layers` lists them.
    """

    spec: ModelSpec
    parts: Mapping[str, Part]
    registry: Registry = field(compare=False, repr=False)
    layer_parts: tuple[tuple[str, tuple[int, ...], Part | None], ...] = ()

    @property
    def entries(self) -> Mapping[str, Entry]:
        """The registry entry of each slot's whole-model part."""
        return {slot: part.entry for slot, part in self.parts.items()}

    def component(self, kind: str) -> Component:
        return self.parts[kind].component

    def provenance(self, kind: str) -> Provenance:
        return self.parts[kind].provenance

    def features(self, kind: str) -> frozenset[str]:
        return self.component(kind).features

    @property
    def kernel_gqa(self) -> bool:
        """Whether the attention kernel takes k, v with fewer heads than q."""
        return "gqa" in self.features("attn")

    def kwargs(self, kind: str) -> dict[str, Any]:
        """What `kind`'s factory and declarations receive: its model dimensions and arguments.

        A kernel without the "gqa" feature gets `num_kv_heads = num_heads`: the model repeats
        k and v for it, so it is built for, and counts, that many heads. A `qk_norm` is built
        for one head's width (`qk_norm_scope=head`) or for q's full width
        (`num_heads · head_dim`; the key norm for `num_kv_heads · head_dim`).
        """
        part = self.parts[kind]
        if kind == "qk_norm":
            width = self.spec.head_dim
            if self.spec.qk_norm_scope == "full":
                width *= self.spec.num_heads
            dims: dict[str, Any] = {"d_model": width}
        else:
            dims = self.spec.dims(kind)
        kwargs: dict[str, Any] = {**dims, **part.kwargs()}
        if kind == "attn" and not self.kernel_gqa:
            kwargs["num_kv_heads"] = self.spec.num_heads
        return kwargs

    def create(self, kind: str, *, device: Any = None, dtype: Any = None, **extra: Any) -> Any:
        """Build one module of `kind` for this model: a `torch.nn.Module` implementing the
        kind's protocol, else a `PluginError` naming the component and its distribution. The
        module's outputs are checked (shape, dtype) on every call; see `checked_module`.
        `extra` adds to (or replaces) what `kwargs(kind)` gives, e.g. a block's modules."""
        return self.parts[kind].create(**{**self.kwargs(kind), **extra}, device=device, dtype=dtype)

    def norm_names(self) -> tuple[str, ...]:
        """The attribute names of the norms the block builds, from its `norms` declaration."""
        names = self.parts["block"].entry.invoke("norms", self.parts["block"].kwargs())
        return tuple(names or ())

    @cached_property
    def layers(self) -> tuple[Blueprint, ...]:
        """The blueprint of each layer: its own values in `spec` and its own parts."""
        n = self.spec.num_layers
        if not self.spec.layers:
            return (self,) * n
        out = []
        for i in range(n):
            parts = dict(self.parts)
            for slot, chosen, part in self.layer_parts:
                if i in chosen:
                    if part is None:
                        parts.pop(slot, None)
                    else:
                        parts[slot] = part
            out.append(replace(self, spec=self.spec.at(i), parts=parts, layer_parts=()))
        return tuple(out)

    def layer(self, i: int) -> Blueprint:
        return self.layers[i]

    def groups(self) -> list[tuple[tuple[int, ...], Blueprint]]:
        """The distinct layers: `(indices, blueprint)`, in the order of their first layer."""
        found: dict[ModelSpec, list[int]] = {}
        first: dict[ModelSpec, Blueprint] = {}
        for i, bp in enumerate(self.layers):
            found.setdefault(bp.spec, []).append(i)
            first.setdefault(bp.spec, bp)
        return [(tuple(idx), first[spec]) for spec, idx in found.items()]

    def used(self) -> list[tuple[str, Part]]:
        """`(where, part)` for every component the model uses, each once, in spec order: the
        whole-model slots, then the per-layer values, each followed by its nested parts."""
        seen: set[tuple[str, str, str | None]] = set()
        out: list[tuple[str, Part]] = []
        places: list[tuple[str, Part | None]] = [*self.parts.items()]
        n = self.spec.num_layers
        places += [(f"{s}[{format_layers(ls, n)}]", p) for s, ls, p in self.layer_parts]
        for where, top in places:
            for part in top.walk() if top is not None else ():
                key = (part.kind, part.name, part.provenance.qualifier)
                if key not in seen:
                    seen.add(key)
                    out.append((where if part is top else f"{where} ({part.kind})", part))
        return out

    def __str__(self) -> str:
        return str(self.spec)


def resolve(spec: str | ModelSpec | Blueprint, registry: Registry | None = None) -> Blueprint:
    """Resolve a spec string (or a `ModelSpec`, validated anew) against `registry` (default: the
    one in use). A `Blueprint` is returned as it is, when it was resolved in the same registry."""
    if isinstance(spec, Blueprint) and registry in (None, spec.registry):
        return spec
    if isinstance(spec, Blueprint | ModelSpec):
        spec = str(spec)
    if not isinstance(spec, str):
        raise SpecTypeError(
            f"expected a spec string, ModelSpec or Blueprint, got {type(spec).__name__}"
        )
    return _Resolver(spec, registry or get_registry()).resolve()


def parse_spec(text: str, registry: Registry | None = None) -> ModelSpec:
    """Parse, expand and validate a spec string; the canonical `ModelSpec` (`resolve(...).spec`).

    Raises `SpecError` (showing the spec with a caret under the bad token) for anything invalid.
    """
    if not isinstance(text, str):
        raise SpecTypeError(f"parse_spec expects a spec string, got {type(text).__name__}")
    return resolve(text, registry).spec


@dataclass(frozen=True)
class _Origin:
    """Where a value was written: the user's spec, or a preset's text."""

    text: str
    item: Item
    preset: str | None = None  # name of the preset whose text this is


@dataclass
class _Layered:
    """A key's value on every layer, and which item set it there (None: the whole-model one)."""

    values: list[Any]
    parts: list[Part | None]
    origins: list[_Origin | None]
    base_origin: _Origin | None


def divisors_near(n: int, target: int, count: int = 4) -> list[int]:
    """Up to `count` divisors of `n` closest to `target`, ascending. Looks only at 1, `n`, the
    powers of two and a window around `target` of at most 4,097 numbers, so the work never grows
    with `n` (a spec's integers reach 2**63)."""
    half = min(max(256, target), 2048)
    window = range(max(1, target - half), min(n, target + half) + 1)
    powers = (2**k for k in range(min(n.bit_length(), 64)))
    found = {d for d in (1, n, *window, *powers) if 1 <= d <= n and n % d == 0}
    return sorted(sorted(found, key=lambda d: (abs(d - target), d))[:count])


# Model keys with a plain default (the others are derived, or components).
_PLAIN_KEYS = tuple(
    a.name
    for a in KEY_ARGS.values()
    if a.kind is None and a.name not in ("num_kv_heads", "d_ff", "head_dim", "query_scale")
)


class _Resolver:
    def __init__(self, text: str, registry: Registry):
        self.text = text
        self.registry = registry
        self.values: dict[str, _Origin] = {}  # the preset's items, overridden by the user's
        self.layered: dict[str, list[_Origin]] = {}  # key[layers]=value items, the preset's first
        self.preset_item: Item | None = None
        self.blame: dict[tuple[str, int], _Origin] = {}  # (key, layer): the item that set it

    # ---------------------------------------------------------------- errors

    def fail(self, message: str, origin: _Origin, start: int = -1, end: int = -1) -> SpecError:
        """A SpecError at the whole value of `origin` (or at `start:end` within the user's text);
        a value from a preset points at the preset's name instead."""
        if origin.preset is not None:
            assert self.preset_item is not None
            key = origin.item.key
            if origin.item.layers is not None:
                key = f"{key}[...]"
            message = f"{message} [from preset {origin.preset!r}: {key}=...]"
            return SpecError(message, self.text, self.preset_item.start, self.preset_item.end)
        if start < 0:
            start, end = origin.item.value.start, origin.item.value.end
        return SpecError(message, origin.text, start, end)

    def at_slot(self, key: str, message: str, layers: tuple[int, ...] = ()) -> SpecError:
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

    def by_user(self, key: str) -> bool:
        return key in self.values and self.values[key].preset is None

    # ---------------------------------------------------------------- steps

    def resolve(self) -> Blueprint:
        user, user_layered = self.collect(parse_items(self.text), None)
        preset, preset_layered = self.expand_preset()
        self.values = {**preset, **user}
        for key in LAYER_KEYS:  # a user's key=value replaces the preset's key[layers] items too
            found = [
                *([] if key in user else preset_layered.get(key, [])),
                *user_layered.get(key, []),
            ]
            if found:
                self.layered[key] = found
        values: dict[str, Any] = {name: self.model_key(KEY_ARGS[name]) for name in _PLAIN_KEYS}
        parts: dict[str, Part] = {slot: self.component(slot) for slot in SLOTS}
        qk = self.qk_norm(self.values.get("qk_norm"))
        if qk is not None:
            parts["qk_norm"] = qk
        d_model, heads = values["d_model"], values["num_heads"]
        values["num_kv_heads"] = self.num_kv_heads(heads)
        values["head_dim"] = self.given("head_dim", d_model // heads)
        values["query_scale"] = self.given("query_scale", default_query_scale(values["head_dim"]))
        values["d_ff"] = self.d_ff(d_model, parts["ffn"], preset)
        values.update({slot: part.spec for slot, part in parts.items()})
        values.setdefault("qk_norm", None)
        layers, layer_parts = self.per_layer(values, parts)
        spec = ModelSpec(**values, layers=layers)
        bp = Blueprint(spec, parts, self.registry, layer_parts)
        self.check_shape(bp)
        return bp

    def collect(
        self, items: list[Item], preset: str | None, text: str | None = None
    ) -> tuple[dict[str, _Origin], dict[str, list[_Origin]]]:
        """The items by key (`key=value`) and the per-layer ones (`key[layers]=value`) in order;
        the user's (preset None, recording the preset item) or a preset's (malformed: raised)."""
        plain: dict[str, _Origin] = {}
        layered: dict[str, list[_Origin]] = {}
        src = self.text if text is None else text

        def bad(message: str, item: Item) -> SpecError:
            if preset is not None:
                return self.malformed(message)
            return SpecError(message, self.text, item.start, item.end)

        for n, item in enumerate(items):
            if item.key is None:
                if preset is not None:
                    raise self.malformed("it names another preset")
                if n > 0:
                    raise bad(
                        f"a bare name ({clip(item.value.name or '')}) is a preset and can only "
                        "come first; everything after it is key=value",
                        item,
                    )
                self.preset_item = item
            elif item.key not in ALL_KEYS:
                raise bad(
                    f"unknown key {clip(item.key)}{did_you_mean(item.key, ALL_KEYS)}; "
                    f"keys are {', '.join(ALL_KEYS)}",
                    item,
                )
            elif item.layers is not None:
                if item.key not in LAYER_KEYS:
                    raise bad(
                        f"{item.key} is one value for the whole model; the keys that may differ "
                        f"by layer are {', '.join(LAYER_KEYS)}",
                        item,
                    )
                layered.setdefault(item.key, []).append(_Origin(src, item, preset))
            elif item.key in plain:
                raise bad(
                    f"key {item.key!r} is given twice (first at position "
                    f"{plain[item.key].item.start}); keep one",
                    item,
                )
            else:
                plain[item.key] = _Origin(src, item, preset)
        return plain, layered

    def malformed(self, problem: str) -> SpecError:
        assert self.preset_item is not None
        value = self.preset_item.value
        entry = self.registry.get_preset(value.name or "", value.provider)
        return SpecError(
            f"preset {value.name!r} from {entry.provenance} is malformed: {problem}",
            self.text,
            value.start,
            value.end,
        )

    def expand_preset(self) -> tuple[dict[str, _Origin], dict[str, list[_Origin]]]:
        if self.preset_item is None:
            return {}, {}
        value = self.preset_item.value
        assert value.name is not None
        try:
            entry = self.registry.get_preset(value.name, value.provider)
        except RegistryError as e:
            raise SpecError(str(e), self.text, value.start, value.end) from e
        try:
            items = parse_items(entry.preset.spec)
        except SpecError as e:
            raise self.malformed(e.message) from e
        return self.collect(items, value.name, entry.preset.spec)

    def model_key(self, arg: Arg) -> Any:
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

    def check_key(self, arg: Arg, origin: _Origin) -> Any:
        value = origin.item.value
        if value.scalar is None and not value.is_plain_name:
            raise self.fail(f"{arg.name} takes a plain {arg.type_name}, not a component", origin)
        try:
            return arg.check(value.scalar if value.scalar is not None else value.name)
        except (TypeError, ValueError) as e:
            raise self.fail(f"{arg.name} {e}", origin) from None

    def given(self, key: str, derived: Any) -> Any:
        """`key`'s value when the spec gives it, else `derived`."""
        origin = self.values.get(key)
        return derived if origin is None else self.check_key(KEY_ARGS[key], origin)

    # ---------------------------------------------------------------- components

    def component(self, slot: str) -> Part:
        """The part filling `slot`: its entry and every argument checked, defaults filled in.
        An ffn's `d_ff` argument is left to `d_ff`."""
        origin = self.values.get(slot)
        value = Value(0, 0, name=SLOTS[slot], args=()) if origin is None else origin.item.value
        return self.part(SLOT_KINDS[slot], value, origin, slot)

    def qk_norm(self, origin: _Origin | None) -> Part | None:
        if origin is None or (origin.item.value.is_plain_name and origin.item.value.name == "none"):
            return None
        return self.part("norm", origin.item.value, origin, "qk_norm")

    def part(
        self, kind: str, value: Value, origin: _Origin | None, label: str, depth: int = 0
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
            return self.fail(message, origin, start, end)

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
        accepted = (
            [*declared, "d_ff"] if kind == "ffn" and "d_ff" not in declared else list(declared)
        )
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
        if depth > 0 and "d_ff" in given and "d_ff" not in declared:
            raw, start, end = given["d_ff"]
            if isinstance(raw, Value):
                raise fail(
                    f"argument 'd_ff' of {kind} {comp.name!r} takes an int, not a component",
                    start,
                    end,
                )
            try:
                width = KEY_ARGS["d_ff"].check(raw)
            except (TypeError, ValueError) as e:
                raise fail(f"argument 'd_ff' of {kind} {comp.name!r} {e}", start, end) from None
            values.append(("d_ff", width))
            written.append(("d_ff", width))
        ambiguous = self.registry.is_ambiguous(kind, comp.name)
        provider = entry.provenance.qualifier if ambiguous else None
        return Part(ComponentSpec(comp.name, tuple(written), provider), entry, tuple(values))

    def argument(
        self,
        kind: str,
        comp: Component,
        a: Arg,
        raw: Any,
        origin: _Origin | None,
        start: int,
        end: int,
        depth: int,
    ) -> tuple[Any, Any]:
        """`(value for the factory, canonical value)` of argument `a` as written."""
        where = f"argument {a.name!r} of {kind} {comp.name!r}"

        def fail(message: str) -> SpecError:
            return SpecError(message) if origin is None else self.fail(message, origin, start, end)

        if a.kind is None:
            if isinstance(raw, Value):
                raise fail(f"{where} expects {a.type_name}, got a component")
            try:
                checked = a.check(raw)
            except (TypeError, ValueError) as err:
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
        self, kind: str, comp: Component, a: Arg, value: Value, origin: _Origin | None, depth: int
    ) -> tuple[Any, Any]:
        """`(value for the factory, canonical value)` of argument `a`'s default; a component
        default is spec text, resolved here (its errors point at the component using it)."""
        if a.kind is None:
            checked = a.check(a.default)
            return checked, checked
        if a.default is None:
            return None, None
        where = f"the default of argument {a.name!r} of {kind} {comp.name!r}, {a.default!r}"
        try:
            parsed = parse_value(a.default)
        except SpecError as e:
            raise (
                self.fail(f"{where}, is malformed: {e.message}", origin)
                if origin
                else SpecError(f"{where}, is malformed: {e.message}")
            ) from e
        part = self.part(a.kind, _moved(parsed, value.start, value.end), origin, where, depth + 1)
        return part, part.spec

    # ---------------------------------------------------------------- derived keys

    def num_kv_heads(self, num_heads: int) -> int:
        if "num_kv_heads" not in self.values:
            return num_heads
        value: int = self.model_key(KEY_ARGS["num_kv_heads"])
        if num_heads % value:
            raise self.fail(
                f"num_kv_heads={value} must divide num_heads={num_heads} "
                "(each key/value head serves a whole group of query heads)",
                self.values["num_kv_heads"],
            )
        return value

    def d_ff(self, d_model: int, ffn: Part, preset: dict[str, _Origin]) -> int:
        """The feed-forward width, from (first match): the ffn's `d_ff` argument, the `d_ff` key,
        the ffn's `default_d_ff(d_model)`, else 4·d_model.

        A preset's `d_ff` belongs to the preset's ffn: a spec that switches to another ffn
        without giving `d_ff` gets the new ffn's default.
        """
        arg = KEY_ARGS["d_ff"]
        origin = self.values.get("ffn")
        given = [a for a in (origin.item.value.args or ()) if a[0] == "d_ff"] if origin else []
        if given and "d_ff" not in {a.name for a in ffn.component.args}:
            _, raw, start, end = given[0]
            if self.by_user("d_ff"):
                raise self.fail(
                    "d_ff is given twice: as a model key and as an argument of ffn; keep one",
                    self.values["d_ff"],
                    self.values["d_ff"].item.start,
                    self.values["d_ff"].item.end,
                )
            try:
                if isinstance(raw, Value):
                    raise TypeError("expects int, got a component")
                return int(arg.check(raw))
            except (TypeError, ValueError) as e:
                message = f"argument 'd_ff' of ffn {ffn.name!r} {e}"
                raise self.fail(message, self.values["ffn"], start, end) from None
        preset_ffn = preset["ffn"].item.value.name if "ffn" in preset else SLOTS["ffn"]
        if "d_ff" in self.values and (self.by_user("d_ff") or ffn.name == preset_ffn):
            value: int = self.model_key(arg)
            return value
        try:
            width = ffn.entry.count("default_d_ff", {"d_model": d_model})
        except PluginError as e:
            raise self.at_slot("ffn", str(e)) from e
        source = f"default_d_ff of ffn {ffn.name!r} from {ffn.provenance}"
        if width is None:
            width, source = 4 * d_model, "the default d_ff = 4·d_model"
        try:
            value = int(arg.check(width))
        except (TypeError, ValueError) as e:
            raise self.at_slot("ffn", f"{source} gave d_ff {e}") from None
        if value > MAX_INT:  # the canonical form must parse back
            raise self.at_slot(
                "ffn",
                f"{source} gives d_ff={value:,}, beyond the largest integer a spec can hold "
                f"(2**63 - 1); give d_ff=... explicitly",
            )
        return value

    # ---------------------------------------------------------------- per-layer values

    def per_layer(
        self, values: dict[str, Any], parts: dict[str, Part]
    ) -> tuple[tuple[LayerValue, ...], tuple[tuple[str, tuple[int, ...], Part | None], ...]]:
        """Apply the `key[layers]=value` items to the whole-model `values` (and `parts`), then
        choose each varying key's canonical whole-model value (`lmcore.spec`); both dicts are
        updated to it. Returns the per-layer differences and the parts they hold."""
        if not self.layered:
            return (), ()
        n = values["num_layers"]
        if n > MAX_LAYERED:
            first = next(iter(self.layered.values()))[0]
            raise self.fail(
                f"a spec with per-layer values has at most {MAX_LAYERED:,} layers; this one has "
                f"num_layers={n:,}",
                first,
                *first.item.layers_span,
            )
        table: dict[str, _Layered] = {}
        for key, origins in self.layered.items():
            lay = _Layered([values[key]] * n, [parts.get(key)] * n, [None] * n, None)
            for origin in origins:
                chosen = self.select(key, origin, n, lay)
                value, part = self.layer_value(key, origin)
                for i in chosen:
                    lay.values[i], lay.parts[i], lay.origins[i] = value, part, origin
                if key == "ffn":
                    self.ffn_width(origin, chosen, values, parts, table, n)
            table[key] = lay
        layers: list[LayerValue] = []
        layer_parts: list[tuple[str, tuple[int, ...], Part | None]] = []
        for key in LAYER_KEYS:
            if key not in table:
                continue
            lay = table[key]
            whole = (
                values[key]
                if key == "norm"
                else canonical_base(lay.values, self.default_of(key, values))
            )
            if whole != values[key]:
                values[key] = whole
                if key in SLOT_KINDS:
                    part = lay.parts[lay.values.index(whole)]
                    if part is None:
                        parts.pop(key, None)
                    else:
                        parts[key] = part
            for i, setter in enumerate(lay.origins):
                if setter is not None:
                    self.blame[key, i] = setter
            for group in layer_groups(key, lay.values, whole):
                layers.append(group)
                if key in SLOT_KINDS:
                    layer_parts.append((key, group.layers, lay.parts[group.layers[0]]))
        order = {key: n for n, key in enumerate(LAYER_KEYS)}
        layers.sort(key=lambda lv: (order[lv.key], lv.layers[0]))
        return tuple(layers), tuple(layer_parts)

    def select(self, key: str, origin: _Origin, n: int, lay: _Layered) -> list[int]:
        """The layers `origin` (a `key[layers]=value` item) names: each once, none that another
        item of the same spec (or of the same preset) gave `key` already."""
        seen: set[int] = set()
        for r in origin.item.layers or ():
            try:
                picked = r.select(n)
            except ValueError as e:
                raise self.fail(f"{key}[...]: {e}", origin, r.begin, r.end) from None
            for i in picked:
                if i in seen:
                    raise self.fail(
                        f"{key}[...] selects layer {i} twice; name each layer once",
                        origin,
                        r.begin,
                        r.end,
                    )
                seen.add(i)
                earlier = lay.origins[i]
                if earlier is not None and (earlier.preset is None) == (origin.preset is None):
                    raise self.fail(
                        f"layer {i} gets {key} twice (from {key}[...] at position "
                        f"{earlier.item.start} and here); keep one",
                        origin,
                        *origin.item.layers_span,
                    )
        return sorted(seen)

    def layer_value(self, key: str, origin: _Origin) -> tuple[Any, Part | None]:
        """The canonical value of a `key[layers]=value` item, and its part for a component."""
        if key == "qk_norm":
            part = self.qk_norm(origin)
            return (None if part is None else part.spec), part
        if key in SLOTS:
            part = self.part(SLOT_KINDS[key], origin.item.value, origin, key)
            return part.spec, part
        return self.check_key(KEY_ARGS[key], origin), None

    def ffn_width(
        self,
        origin: _Origin,
        chosen: list[int],
        values: dict[str, Any],
        parts: dict[str, Part],
        table: dict[str, _Layered],
        n: int,
    ) -> None:
        """`ffn[layers]=name(d_ff=...)`: the width belongs to `d_ff` on those layers, as a
        whole-model ffn's belongs to the model's `d_ff`."""
        value = origin.item.value
        given = [a for a in value.args or () if a[0] == "d_ff"]
        if not given or "d_ff" in {a.name for a in parts["ffn"].component.args}:
            return
        _, raw, start, end = given[0]
        try:
            if isinstance(raw, Value):
                raise TypeError("expects int, got a component")
            width = int(KEY_ARGS["d_ff"].check(raw))
        except (TypeError, ValueError) as e:
            raise self.fail(
                f"argument 'd_ff' of ffn {value.name!r} {e}", origin, start, end
            ) from None
        lay = table.get("d_ff") or _Layered([values["d_ff"]] * n, [None] * n, [None] * n, None)
        for i in chosen:
            if lay.origins[i] is not None and lay.origins[i] is not origin:
                raise self.fail(
                    f"d_ff of layer {i} is given twice: by d_ff[...] and as an argument of "
                    "ffn[...]; keep one",
                    origin,
                    start,
                    end,
                )
            lay.values[i], lay.origins[i] = width, origin
        table["d_ff"] = lay

    def default_of(self, key: str, values: dict[str, Any]) -> Any:
        """`key`'s default for choosing the canonical whole-model value (REQUIRED: none)."""
        from lmcore.components import REQUIRED

        if key in SLOTS:
            try:
                return self.part(key, Value(0, 0, name=SLOTS[key], args=()), None, key).spec
            except SpecError:
                return REQUIRED
        if key == "query_scale":
            return default_query_scale(values["head_dim"])
        if key == "d_ff":
            return REQUIRED
        return KEY_ARGS[key].default

    # ---------------------------------------------------------------- shape and features

    def check_shape(self, bp: Blueprint) -> None:
        spec = bp.spec
        d_model, heads = spec.d_model, spec.num_heads
        if "head_dim" not in self.values and d_model % heads:
            raise self.at_slot(
                "num_heads" if "num_heads" in self.values else "d_model",
                f"d_model={d_model} is not divisible by num_heads={heads}; "
                f"num_heads that divide it: {', '.join(map(str, divisors_near(d_model, heads)))}"
                f", or give head_dim=... (the width of each head)",
            )
        absolute = [
            p.name for _, p in bp.used() if p.kind == "pos" and "absolute" in p.component.features
        ]
        if spec.varies("pos") and absolute:
            raise self.at_slot(
                "pos",
                f"pos {absolute[0]!r} adds to the token embeddings, once for every layer, so it "
                "cannot differ by layer; give it to the whole model (pos=...) with no pos[...]",
            )
        for layers, lbp in bp.groups():
            self.check_layer(lbp, layers)

    def check_layer(self, bp: Blueprint, layers: tuple[int, ...]) -> None:
        spec = bp.spec
        for slot in bp.parts:
            comp = bp.component(slot)
            widths = [bp.kwargs(slot)]
            if slot == "qk_norm" and spec.qk_norm_scope == "full":
                widths.append({**widths[0], "d_model": spec.num_kv_heads * spec.head_dim})
            for kwargs in widths:
                try:
                    bp.entries[slot].invoke("validate", kwargs, allow=(ValueError,))
                except PluginError as e:
                    raise self.at_slot(slot, str(e), layers) from e
                except ValueError as e:
                    # Blame what the user wrote: the slot (for these layers), else the
                    # dimensions it is built for.
                    dims = spec.dims(SLOT_KINDS[slot]) if slot in SLOTS else {}
                    culprit = next(
                        (k for k in (slot, "num_heads", "d_model", *dims) if self.by_user(k)), slot
                    )
                    if (slot, layers[0]) in self.blame:
                        culprit = slot
                    raise self.at_slot(
                        culprit, f"{SLOT_KINDS[slot]} {comp.name!r}: {e}", layers
                    ) from None
        try:
            names = bp.norm_names()
        except PluginError as e:
            raise self.at_slot("block", str(e), layers) from e
        block = bp.parts["block"]
        bad = [
            x
            for x in names
            if not isinstance(x, str) or not x.isidentifier() or x in ("attn", "ffn")
        ]
        if bad or len(set(names)) != len(names):
            raise self.at_slot(
                "block",
                f"block {block.name!r} from {block.provenance}: its norms declaration gives "
                f"{list(names)!r}; it must name distinct attributes (identifiers other than attn "
                "and ffn), one per norm the block builds",
                layers,
            )
        if spec.qk_norm is None and spec.qk_norm_scope != "head":
            raise self.at_slot(
                "qk_norm_scope",
                "qk_norm_scope=full applies to a qk_norm, and this model has none; add "
                "qk_norm=rmsnorm (or another norm) or drop qk_norm_scope",
                layers,
            )
        pos, attn = bp.component("pos"), bp.component("attn")
        if "bias" in pos.features and "bias" not in attn.features:
            able = [e.name for e in self.registry.entries("attn") if "bias" in e.component.features]
            raise self.at_slot(
                "attn",
                f"attn {attn.name!r} cannot take the additive attention bias that pos "
                f"{pos.name!r} produces; kernels that can: {one_of(able)}",
                layers,
            )
        for key, feature, what in (
            ("window", "window", f"a sliding window (window={spec.window})"),
            ("attn_softcap", "softcap", f"capped scores (attn_softcap={spec.attn_softcap!r})"),
        ):
            if getattr(spec, key) and feature not in attn.features:
                able = [
                    e.name for e in self.registry.entries("attn") if feature in e.component.features
                ]
                raise self.at_slot(
                    key if (key in self.values or (key, layers[0]) in self.blame) else "attn",
                    f"attn {attn.name!r} cannot compute {what}: it does not declare the "
                    f"{feature!r} feature; kernels that can: {one_of(able)}",
                    layers,
                )


def _moved(value: Value, start: int, end: int) -> Value:
    """`value` with every position set to `start:end` (a default's text is not the spec's)."""
    args = None
    if value.args is not None:
        args = tuple(
            (name, _moved(v, start, end) if isinstance(v, Value) else v, start, end)
            for name, v, _, _ in value.args
        )
    return value._replace(start=start, end=end, args=args)
