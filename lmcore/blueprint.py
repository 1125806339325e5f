"""From a spec to the resolved model: `resolve(spec) -> Blueprint`, done once and passed on.

A `Blueprint` is the canonical `ModelSpec` plus, for each component kind, the registry entry that
provides it (with provenance). Everything downstream (the model, accounting and `describe`, the
runner, the CLI, the conformance kit) takes a blueprint and never parses a spec again.
`kwargs(kind)` is the one rule for what a component's factory and declarations receive.

Resolution, in order: parse the items (`lmcore.spec`); expand the preset; look up each component
and check its arguments against its declaration; derive `num_kv_heads` and `d_ff`; check the
shape against each component's `validate`. Every failure is a `SpecError` with a caret under the
token to blame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lmcore.components import KINDS, Arg, Component, Scalar, format_scalar
from lmcore.errors import (
    PluginError,
    RegistryError,
    SpecError,
    SpecTypeError,
    clip,
    did_you_mean,
    one_of,
)
from lmcore.registry import Entry, Provenance, Registry, get_registry
from lmcore.spec import (
    ALL_KEYS,
    KEY_ARGS,
    MAX_INT,
    MODEL_KEYS,
    SLOTS,
    ComponentSpec,
    Item,
    ModelSpec,
    Value,
    parse_items,
)


@dataclass(frozen=True)
class Blueprint:
    """A spec resolved against a registry: the canonical spec and the entry chosen per kind."""

    spec: ModelSpec
    entries: Mapping[str, Entry]
    registry: Registry = field(compare=False, repr=False)

    def component(self, kind: str) -> Component:
        return self.entries[kind].component

    def provenance(self, kind: str) -> Provenance:
        return self.entries[kind].provenance

    def features(self, kind: str) -> frozenset[str]:
        return self.component(kind).features

    @property
    def kernel_gqa(self) -> bool:
        """Whether the attention kernel takes k, v with fewer heads than q."""
        return "gqa" in self.features("attn")

    def kwargs(self, kind: str) -> dict[str, Any]:
        """What `kind`'s factory and declarations receive: its model dimensions and arguments.

        A kernel without the "gqa" feature gets `num_kv_heads = num_heads`: the model repeats
        k and v for it, so it is built for, and counts, that many heads.
        """
        kwargs: dict[str, Any] = {**self.spec.dims(kind), **self.spec.component(kind).kwargs}
        if kind == "attn" and not self.kernel_gqa:
            kwargs["num_kv_heads"] = self.spec.num_heads
        return kwargs

    def create(self, kind: str, *, device: Any = None, dtype: Any = None) -> Any:
        """Build one module of `kind` for this model: a `torch.nn.Module` implementing the
        kind's protocol, else a `PluginError` naming the component and its distribution. The
        module's outputs are checked (shape, dtype) on every call; see `checked_module`."""
        entry = self.entries[kind]
        module = entry.invoke("build", {**self.kwargs(kind), "device": device, "dtype": dtype})
        return checked_module(entry, module)

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


class _Resolver:
    def __init__(self, text: str, registry: Registry):
        self.text = text
        self.registry = registry
        self.values: dict[str, _Origin] = {}  # the preset's items, overridden by the user's
        self.preset_item: Item | None = None

    # ---------------------------------------------------------------- errors

    def fail(self, message: str, origin: _Origin, start: int = -1, end: int = -1) -> SpecError:
        """A SpecError at the whole value of `origin` (or at `start:end` within the user's text);
        a value from a preset points at the preset's name instead."""
        if origin.preset is not None:
            assert self.preset_item is not None
            message = f"{message} [from preset {origin.preset!r}: {origin.item.key}=...]"
            return SpecError(message, self.text, self.preset_item.start, self.preset_item.end)
        if start < 0:
            start, end = origin.item.value.start, origin.item.value.end
        return SpecError(message, origin.text, start, end)

    def at_slot(self, key: str, message: str) -> SpecError:
        """Blame `key`'s value, else the preset, else the whole spec."""
        if key in self.values:
            return self.fail(message, self.values[key])
        where = self.preset_item
        span = (where.start, where.end) if where else (0, len(self.text))
        return SpecError(message, self.text, *span)

    def by_user(self, key: str) -> bool:
        return key in self.values and self.values[key].preset is None

    # ---------------------------------------------------------------- steps

    def resolve(self) -> Blueprint:
        user = self.user_items(parse_items(self.text))
        preset = self.expand_preset()
        self.values = {**preset, **user}
        values: dict[str, Any] = {
            a.name: self.model_key(a) for a in MODEL_KEYS if a.name not in ("num_kv_heads", "d_ff")
        }
        found = {kind: self.component(kind) for kind in KINDS}
        values["num_kv_heads"] = self.num_kv_heads(values["num_heads"])
        values["d_ff"] = self.d_ff(values["d_model"], found["ffn"], preset)
        values.update({kind: cs for kind, (_, cs) in found.items()})
        spec = ModelSpec(**values)
        bp = Blueprint(spec, {kind: entry for kind, (entry, _) in found.items()}, self.registry)
        self.check_shape(bp)
        return bp

    def user_items(self, items: list[Item]) -> dict[str, _Origin]:
        user: dict[str, _Origin] = {}
        for n, item in enumerate(items):
            if item.key is None:
                if n > 0:
                    raise SpecError(
                        f"a bare name ({clip(item.value.name or '')}) is a preset and can only "
                        "come first; everything after it is key=value",
                        self.text,
                        item.start,
                        item.end,
                    )
                self.preset_item = item
            elif item.key not in ALL_KEYS:
                raise SpecError(
                    f"unknown key {clip(item.key)}{did_you_mean(item.key, ALL_KEYS)}; "
                    f"keys are {', '.join(ALL_KEYS)}",
                    self.text,
                    item.start,
                    item.end,
                )
            elif item.key in user:
                raise SpecError(
                    f"key {item.key!r} is given twice (first at position "
                    f"{user[item.key].item.start}); keep one",
                    self.text,
                    item.start,
                    item.end,
                )
            else:
                user[item.key] = _Origin(self.text, item)
        return user

    def expand_preset(self) -> dict[str, _Origin]:
        if self.preset_item is None:
            return {}
        value = self.preset_item.value
        assert value.name is not None
        try:
            entry = self.registry.get_preset(value.name, value.provider)
        except RegistryError as e:
            raise SpecError(str(e), self.text, value.start, value.end) from e

        def malformed(problem: str) -> SpecError:
            return SpecError(
                f"preset {value.name!r} from {entry.provenance} is malformed: {problem}",
                self.text,
                value.start,
                value.end,
            )

        try:
            items = parse_items(entry.preset.spec)
        except SpecError as e:
            raise malformed(e.message) from e
        out: dict[str, _Origin] = {}
        for item in items:
            if item.key is None:
                raise malformed("it names another preset")
            if item.key not in ALL_KEYS:
                raise malformed(f"it has key {item.key!r}")
            if item.key in out:
                raise malformed(f"it gives {item.key!r} twice")
            out[item.key] = _Origin(entry.preset.spec, item, preset=value.name)
        return out

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
        value = origin.item.value
        if value.scalar is None and not value.is_plain_name:
            raise self.fail(
                f"{arg.name} takes a plain {arg.type.__name__}, not a component", origin
            )
        try:
            return arg.check(value.scalar if value.scalar is not None else value.name)
        except (TypeError, ValueError) as e:
            raise self.fail(f"{arg.name} {e}", origin) from None

    def component(self, kind: str) -> tuple[Entry, ComponentSpec]:
        """The entry for `kind` and its slot with every argument checked and defaults filled in.
        An ffn's `d_ff` argument is left to `d_ff`."""
        origin = self.values.get(kind)
        value = Value(0, 0, name=SLOTS[kind], args=()) if origin is None else origin.item.value
        if value.name is None:
            assert origin is not None  # the default slot value is a name
            shown = format_scalar(value.scalar) if value.scalar is not None else ""
            raise self.fail(
                f"{kind} takes a component, e.g. {kind}={SLOTS[kind]} or "
                f"{kind}=name(arg=value); got {clip(shown)}; "
                f"available {kind}: {one_of(self.registry.names(kind))}",
                origin,
            )
        try:
            entry = self.registry.get(kind, value.name, value.provider)
        except RegistryError as e:
            if origin is None:
                raise SpecError(f"default {kind} {value.name!r} is unavailable: {e}") from e
            raise self.fail(str(e), origin) from e
        comp = entry.component
        declared = {a.name: a for a in comp.args}
        given = {name: (raw, start, end) for name, raw, start, end in value.args or ()}
        accepted = [*declared, "d_ff"] if kind == "ffn" else list(declared)
        for name, (_, start, end) in given.items():
            if name not in accepted:
                raise self.fail(
                    f"{kind} {comp.name!r} has no argument {clip(name)}"
                    f"{did_you_mean(name, accepted)}; it takes: {one_of(accepted)}",
                    self.values[kind],
                    start,
                    end,
                )
        resolved: list[tuple[str, Scalar]] = []
        for a in comp.args:
            if a.name in given:
                raw, start, end = given[a.name]
                try:
                    resolved.append((a.name, a.check(raw)))
                except (TypeError, ValueError) as err:
                    message = f"argument {a.name!r} of {kind} {comp.name!r} {err}"
                    raise self.fail(message, self.values[kind], start, end) from None
            elif a.required:
                assert origin is not None  # defaults have no required arguments
                raise self.fail(
                    f"{kind} {comp.name!r} needs argument {a.name!r} "
                    f"({a.type.__name__}: {a.help}); write {kind}={comp.name}({a.name}=...)",
                    origin,
                )
            else:
                resolved.append((a.name, a.default))
        ambiguous = self.registry.is_ambiguous(kind, comp.name)
        provider = entry.provenance.qualifier if ambiguous else None
        return entry, ComponentSpec(comp.name, tuple(resolved), provider)

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

    def d_ff(
        self, d_model: int, ffn: tuple[Entry, ComponentSpec], preset: dict[str, _Origin]
    ) -> int:
        """The feed-forward width, from (first match): the ffn's `d_ff` argument, the `d_ff` key,
        the ffn's `default_d_ff(d_model)`, else 4·d_model.

        A preset's `d_ff` belongs to the preset's ffn: a spec that switches to another ffn
        without giving `d_ff` gets the new ffn's default.
        """
        arg = KEY_ARGS["d_ff"]
        origin = self.values.get("ffn")
        given = [a for a in (origin.item.value.args or ()) if a[0] == "d_ff"] if origin else []
        if given:
            _, raw, start, end = given[0]
            if self.by_user("d_ff"):
                raise self.fail(
                    "d_ff is given twice: as a model key and as an argument of ffn; keep one",
                    self.values["d_ff"],
                    self.values["d_ff"].item.start,
                    self.values["d_ff"].item.end,
                )
            try:
                return int(arg.check(raw))
            except (TypeError, ValueError) as e:
                message = f"argument 'd_ff' of ffn {ffn[1].name!r} {e}"
                raise self.fail(message, self.values["ffn"], start, end) from None
        preset_ffn = preset["ffn"].item.value.name if "ffn" in preset else SLOTS["ffn"]
        if "d_ff" in self.values and (self.by_user("d_ff") or ffn[1].name == preset_ffn):
            value: int = self.model_key(arg)
            return value
        try:
            width = ffn[0].count("default_d_ff", {"d_model": d_model})
        except PluginError as e:
            raise self.at_slot("ffn", str(e)) from e
        source = f"default_d_ff of ffn {ffn[1].name!r} from {ffn[0].provenance}"
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

    def check_shape(self, bp: Blueprint) -> None:
        spec = bp.spec
        d_model, heads = spec.d_model, spec.num_heads
        if d_model % heads:
            raise self.at_slot(
                "num_heads" if "num_heads" in self.values else "d_model",
                f"d_model={d_model} is not divisible by num_heads={heads}; "
                f"num_heads that divide it: {', '.join(map(str, divisors_near(d_model, heads)))}",
            )
        for kind in KINDS:
            comp = bp.component(kind)
            try:
                bp.entries[kind].invoke("validate", bp.kwargs(kind), allow=(ValueError,))
            except PluginError as e:
                raise self.at_slot(kind, str(e)) from e
            except ValueError as e:
                # Blame what the user wrote: the slot itself, else the dimensions it is built for.
                dims = spec.dims(kind)
                culprit = next(
                    (k for k in (kind, "num_heads", "d_model", *dims) if self.by_user(k)), kind
                )
                raise self.at_slot(culprit, f"{kind} {comp.name!r}: {e}") from None
        pos, attn = bp.component("pos"), bp.component("attn")
        if "bias" in pos.features and "bias" not in attn.features:
            able = [e.name for e in self.registry.entries("attn") if "bias" in e.component.features]
            raise self.at_slot(
                "attn",
                f"attn {attn.name!r} cannot take the additive attention bias that pos "
                f"{pos.name!r} produces; kernels that can: {one_of(able)}",
            )


def divisors_near(n: int, target: int, count: int = 4) -> list[int]:
    """Up to `count` divisors of `n` closest to `target`, ascending. Looks only at 1, `n`, the
    powers of two and a window around `target` of at most 4,097 numbers, so the work never grows
    with `n` (a spec's integers reach 2**63)."""
    half = min(max(256, target), 2048)
    window = range(max(1, target - half), min(n, target + half) + 1)
    powers = (2**k for k in range(min(n.bit_length(), 64)))
    found = {d for d in (1, n, *window, *powers) if 1 <= d <= n and n % d == 0}
    return sorted(sorted(found, key=lambda d: (abs(d - target), d))[:count])


def checked_module(entry: Entry, module: Any) -> Any:
    """`module` once it is a `torch.nn.Module` implementing its kind's protocol, with a forward
    hook that checks its output (norm, ffn: the input's shape and dtype; attn: q's), so a
    plugin that gets them wrong is named at its first call instead of failing somewhere later.
    """
    from torch import nn

    from lmcore.interfaces import PROTOCOLS

    where = f"{entry.kind} {entry.name!r} from {entry.provenance}"
    protocol = PROTOCOLS[entry.kind]
    if not isinstance(module, nn.Module) or not isinstance(module, protocol):
        got = "None" if module is None else f"a {type(module).__name__}"
        raise PluginError(
            f"{where}: its factory returned {got}, not a torch.nn.Module implementing "
            f"lmcore.interfaces.{protocol.__name__}"
        )
    if entry.kind != "pos":
        module.register_forward_hook(_OutputCheck(where, entry.kind))
    return module


@dataclass(frozen=True)
class _OutputCheck:
    """A forward hook: the output has the shape and dtype of the first input (x, or q)."""

    where: str
    kind: str

    def __call__(self, module: Any, args: tuple[Any, ...], out: Any) -> None:
        from torch import Tensor

        x = args[0]
        if isinstance(out, Tensor) and out.shape == x.shape and out.dtype == x.dtype:
            return
        what = "q's" if self.kind == "attn" else "its input's"
        got = f"shape {tuple(out.shape)} {out.dtype}" if isinstance(out, Tensor) else type(out)
        raise PluginError(
            f"{self.where} returned {got} for {'q' if self.kind == 'attn' else 'an input'} of "
            f"shape {tuple(x.shape)} {x.dtype}; a {self.kind} must return {what} shape and dtype"
        )
