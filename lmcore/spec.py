"""The spec grammar: `parse_spec` turns a spec string into a validated, canonical `ModelSpec`.

    spec      := item ("," item)*             the first item may be a preset name
    item      := qualname | key "=" value
    value     := scalar | qualname ["(" [arg ("," arg)*] ")"]
    arg       := name "=" scalar
    scalar    := integer | float | true | false | name | quoted string
    qualname  := [dist ":"] name

`str(spec)` is canonical: preset expanded, every key in a fixed order, every component argument
written out, no spaces; `parse_spec(str(s)) == s`. Nothing in a spec is evaluated or imported.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, cast

from lmcore.components import (
    DIMS,
    KINDS,
    NAME_RE,
    REQUIRED,
    Arg,
    Component,
    Scalar,
    format_scalar,
)
from lmcore.errors import RegistryError, SpecError, did_you_mean, one_of
from lmcore.registry import Registry, get_registry

# ------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class ComponentSpec:
    """One component slot: ``rope(theta=10000.0)``; `provider` only when the name is ambiguous."""

    name: str
    args: tuple[tuple[str, Scalar], ...] = ()
    provider: str | None = None

    @property
    def kwargs(self) -> dict[str, Scalar]:
        return dict(self.args)

    def __str__(self) -> str:
        qualified = f"{self.provider}:{self.name}" if self.provider else self.name
        if not self.args:
            return qualified
        inner = ",".join(f"{k}={format_scalar(v)}" for k, v in self.args)
        return f"{qualified}({inner})"


@dataclass(frozen=True)
class ModelSpec:
    """A fully resolved model: every hyperparameter and component, defaults filled in.

    Build one with `parse_spec`; `str(spec)` is its canonical spec string.
    """

    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    block: str
    tie_embeddings: bool
    norm: ComponentSpec
    ffn: ComponentSpec
    pos: ComponentSpec
    attn: ComponentSpec

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def component(self, kind: str) -> ComponentSpec:
        spec: ComponentSpec = getattr(self, kind)
        return spec

    def dims(self, kind: str) -> dict[str, int]:
        """The model dimensions a component of `kind` is built for (see `lmcore.components`)."""
        every = {
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "context_length": self.context_length,
        }
        return {k: every[k] for k in DIMS[kind]}

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            text = str(value) if isinstance(value, ComponentSpec) else format_scalar(value)
            parts.append(f"{f.name}={text}")
        return ",".join(parts)


# Model keys in canonical order. num_kv_heads and d_ff have derived defaults (see _resolve).
MODEL_KEYS: Final[tuple[Arg, ...]] = (
    Arg("vocab_size", int, REQUIRED, "number of token ids", ge=1),
    Arg("context_length", int, REQUIRED, "longest sequence the model accepts", ge=1),
    Arg("d_model", int, REQUIRED, "width of the residual stream", ge=1),
    Arg("num_layers", int, REQUIRED, "number of transformer blocks", ge=1),
    Arg("num_heads", int, REQUIRED, "query heads per attention layer", ge=1),
    Arg("num_kv_heads", int, REQUIRED, "key/value heads (default: num_heads)", ge=1),
    Arg("d_ff", int, REQUIRED, "feed-forward hidden width (default: the ffn's own)", ge=1),
    Arg("block", str, "prenorm", "residual topology", choices=("prenorm", "postnorm")),
    Arg("tie_embeddings", bool, False, "lm_head shares token_embeddings.weight"),
)
SLOTS: Final[Mapping[str, str]] = {
    "norm": "rmsnorm",
    "ffn": "swiglu",
    "pos": "rope",
    "attn": "sdpa",
}
_KEY_ARGS: Final = {a.name: a for a in MODEL_KEYS}
_DERIVED: Final = ("num_kv_heads", "d_ff")
ALL_KEYS: Final = (*_KEY_ARGS, *SLOTS)

# ------------------------------------------------------------------------------ tokens

_WORD = re.compile(r"[A-Za-z0-9_.+\-]+")
_NUMBER = re.compile(
    r"[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?\Z"
)
_PUNCT = ",=():"


@dataclass(frozen=True)
class _Tok:
    kind: str  # name | number | string | bool | punct | end
    text: str
    start: int
    end: int
    value: Any = None


def _tokenize(src: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif c in _PUNCT:
            toks.append(_Tok("punct", c, i, i + 1))
            i += 1
        elif c in "\"'":
            toks.append(_string(src, i))
            i = toks[-1].end
        elif (m := _WORD.match(src, i)) is not None:
            toks.append(_word(src, m.group(), i))
            i = m.end()
        else:
            raise SpecError(
                f"unexpected character {c!r}; "
                "specs use names, numbers, quoted strings and , = ( ) :",
                src,
                i,
            )
    toks.append(_Tok("end", "", n, n))
    return toks


def _string(src: str, start: int) -> _Tok:
    quote, i = src[start], start + 1
    out: list[str] = []
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}
    while i < len(src):
        c = src[i]
        if c == quote:
            return _Tok("string", src[start : i + 1], start, i + 1, "".join(out))
        if c == "\\":
            nxt = src[i + 1 : i + 2]
            if nxt not in escapes:
                raise SpecError(
                    f"unknown escape '\\{nxt}' in a quoted string; use \\\\, \\{quote}, \\n or \\t",
                    src,
                    i,
                    i + 2,
                )
            out.append(escapes[nxt])
            i += 2
            continue
        out.append(c)
        i += 1
    raise SpecError(f"unterminated string: add the closing {quote}", src, start, len(src))


def _word(src: str, text: str, start: int) -> _Tok:
    end = start + len(text)
    if text[0].isdigit() or text[0] in "+-.":
        if not _NUMBER.match(text):
            raise SpecError(
                f"malformed number {text!r}; names start with a letter or '_', numbers look like "
                "10000, 10_000, 1e-5 or 0.5",
                src,
                start,
                end,
            )
        plain = text.replace("_", "")
        if any(ch in plain for ch in ".eE"):
            value = float(plain)
            if not math.isfinite(value):
                raise SpecError(f"number {text!r} is out of range", src, start, end)
            return _Tok("number", text, start, end, value)
        return _Tok("number", text, start, end, int(plain))
    if text in ("true", "false"):
        return _Tok("bool", text, start, end, text == "true")
    if not NAME_RE.match(text):
        raise SpecError(
            f"invalid name {text!r}: names are letters, digits, '_', '-' and '.'", src, start, end
        )
    return _Tok("name", text, start, end, text)


# ------------------------------------------------------------------------------ syntax


@dataclass(frozen=True)
class _Value:
    """A parsed value: a scalar, or a (qualified) name with an optional argument list."""

    start: int
    end: int
    scalar: Scalar | None = None  # set for numbers, strings, bools
    name: str | None = None
    provider: str | None = None
    args: tuple[tuple[str, Scalar, int, int], ...] | None = None  # (name, value, start, end)

    @property
    def is_plain_name(self) -> bool:
        return self.name is not None and self.provider is None and self.args is None


@dataclass(frozen=True)
class _Item:
    key: str | None  # None for the preset item
    start: int  # of the key (or the preset name)
    end: int
    value: _Value


class _Parser:
    def __init__(self, src: str):
        self.src = src
        self.toks = _tokenize(src)
        self.i = 0

    def peek(self, ahead: int = 0) -> _Tok:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def take(self) -> _Tok:
        tok = self.peek()
        self.i += 1
        return tok

    def error(self, message: str, tok: _Tok) -> SpecError:
        return SpecError(message, self.src, tok.start, tok.end)

    def expect(self, text: str, what: str) -> _Tok:
        tok = self.peek()
        if tok.kind != "punct" or tok.text != text:
            raise self.error(f"expected {what}, found {_show(tok)}", tok)
        return self.take()

    def parse(self) -> list[_Item]:
        if self.peek().kind == "end":
            raise self.error(
                "empty spec; write a preset name (e.g. tinystories) and/or key=value items",
                self.peek(),
            )
        items = [self.item()]
        while self.peek().kind != "end":
            comma = self.expect(",", "',' between items")
            if self.peek().kind == "end":
                raise self.error("trailing ','; remove it or add key=value after it", comma)
            items.append(self.item())
        return items

    def item(self) -> _Item:
        tok = self.peek()
        if tok.kind == "name" and self.peek(1).text == "=" and self.peek(1).kind == "punct":
            self.take()
            self.take()
            return _Item(tok.text, tok.start, tok.end, self.value())
        if tok.kind == "name":
            value = self.value()
            if value.args is not None:
                raise SpecError(
                    f"{tok.text!r} takes no arguments here: a bare name is a preset; "
                    f"components go in slots, e.g. norm={tok.text}(...)",
                    self.src,
                    tok.start,
                    value.end,
                )
            return _Item(None, value.start, value.end, value)
        raise self.error(f"expected key=value or a preset name, found {_show(tok)}", tok)

    def value(self) -> _Value:
        tok = self.take()
        if tok.kind in ("number", "string", "bool"):
            return _Value(tok.start, tok.end, scalar=tok.value)
        if tok.kind != "name":
            raise self.error(
                f"expected a value (number, true/false, name or quoted string), found {_show(tok)}",
                tok,
            )
        provider, name = None, tok
        if self.peek().kind == "punct" and self.peek().text == ":":
            self.take()
            name = self.take()
            if name.kind != "name":
                raise self.error(f"expected a name after '{tok.text}:', found {_show(name)}", name)
            provider = tok.text
        if not (self.peek().kind == "punct" and self.peek().text == "("):
            return _Value(tok.start, name.end, name=name.text, provider=provider)
        self.take()
        args: list[tuple[str, Scalar, int, int]] = []
        while not (self.peek().kind == "punct" and self.peek().text == ")"):
            if args:
                self.expect(",", "',' or ')' in the argument list")
            key = self.take()
            if key.kind != "name":
                raise self.error(f"expected an argument name, found {_show(key)}", key)
            if any(a[0] == key.text for a in args):
                raise self.error(f"argument {key.text!r} is given twice", key)
            self.expect("=", f"'=' after argument {key.text!r}")
            val = self.take()
            if val.kind not in ("number", "string", "bool", "name"):
                raise self.error(f"expected a value for {key.text!r}, found {_show(val)}", val)
            if self.peek().kind == "punct" and self.peek().text in ":(":
                raise self.error("argument values are plain values, not components", self.peek())
            args.append((key.text, val.value, key.start, val.end))
        close = self.take()
        return _Value(tok.start, close.end, name=name.text, provider=provider, args=tuple(args))


def _show(tok: _Tok) -> str:
    return "end of spec" if tok.kind == "end" else repr(tok.text)


# ------------------------------------------------------------------------------ meaning


@dataclass(frozen=True)
class _Origin:
    """Where a value was written: the user's spec, or a preset's text."""

    text: str
    item: _Item
    preset: str | None = None  # name of the preset whose text this is


def parse_spec(text: str, registry: Registry | None = None) -> ModelSpec:
    """Parse, expand and validate a spec string against the registry's components and presets.

    Raises `SpecError` (showing the spec with a caret under the bad token) for anything invalid.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_spec expects a spec string, got {type(text).__name__}")
    return _Resolver(text, registry or get_registry()).resolve()


class _Resolver:
    def __init__(self, text: str, registry: Registry):
        self.text = text
        self.registry = registry
        self.values: dict[str, _Origin] = {}
        self.preset_item: _Item | None = None

    def fail(self, message: str, origin: _Origin, *, whole_value: bool = False) -> SpecError:
        item = origin.item
        start, end = (item.value.start, item.value.end) if whole_value else (item.start, item.end)
        if item.key is None:
            start, end = item.start, item.end
        if origin.preset is not None:
            # The value came from a preset: point at the preset's name in the user's spec.
            assert self.preset_item is not None
            message = f"{message} [from preset {origin.preset!r}: {item.key}=...]"
            return SpecError(message, self.text, self.preset_item.start, self.preset_item.end)
        return SpecError(message, origin.text, start, end)

    def resolve(self) -> ModelSpec:
        items = _Parser(self.text).parse()
        user: dict[str, _Origin] = {}
        for n, item in enumerate(items):
            if item.key is None:
                if n > 0:
                    raise SpecError(
                        f"a bare name ({item.value.name!r}) is a preset and can only come first; "
                        "everything after it is key=value",
                        self.text,
                        item.start,
                        item.end,
                    )
                self.preset_item = item
                continue
            if item.key not in ALL_KEYS:
                raise SpecError(
                    f"unknown key {item.key!r}{did_you_mean(item.key, ALL_KEYS)}; "
                    f"keys are {', '.join(ALL_KEYS)}",
                    self.text,
                    item.start,
                    item.end,
                )
            if item.key in user:
                first = user[item.key].item
                raise SpecError(
                    f"key {item.key!r} is given twice (first at position {first.start}); keep one",
                    self.text,
                    item.start,
                    item.end,
                )
            user[item.key] = _Origin(self.text, item)
        self.values = self.expand_preset(user)
        self.values.update(user)

        keys = {a.name: self.model_key(a) for a in MODEL_KEYS if a.name not in _DERIVED}
        comps = {kind: self.component(kind) for kind in KINDS}
        ffn_args = dict(comps["ffn"][1].args)
        keys["num_kv_heads"] = self.num_kv_heads(keys)
        keys["d_ff"] = self.d_ff(keys, comps["ffn"][0], ffn_args.pop("d_ff", None))
        comps["ffn"] = (comps["ffn"][0], _replace_args(comps["ffn"][1], ffn_args))
        self.check_shape(keys, comps)
        return ModelSpec(
            **keys,
            norm=comps["norm"][1],
            ffn=comps["ffn"][1],
            pos=comps["pos"][1],
            attn=comps["attn"][1],
        )

    def expand_preset(self, user: dict[str, _Origin]) -> dict[str, _Origin]:
        if self.preset_item is None:
            return {}
        value = self.preset_item.value
        assert value.name is not None
        try:
            entry = self.registry.get_preset(value.name, value.provider)
        except RegistryError as e:
            raise SpecError(str(e), self.text, value.start, value.end) from e
        name = value.name
        try:
            items = _Parser(entry.preset.spec).parse()
        except SpecError as e:
            raise SpecError(
                f"preset {name!r} from {entry.provenance} is malformed: {e.message}",
                self.text,
                value.start,
                value.end,
            ) from e
        out: dict[str, _Origin] = {}
        for item in items:
            if item.key is None or item.key not in ALL_KEYS or item.key in out:
                problem = "names another preset" if item.key is None else f"has key {item.key!r}"
                if item.key in out:
                    problem = f"gives {item.key!r} twice"
                raise SpecError(
                    f"preset {name!r} from {entry.provenance} is malformed: it {problem}",
                    self.text,
                    value.start,
                    value.end,
                )
            out[item.key] = _Origin(entry.preset.spec, item, preset=name)
        # A preset's d_ff belongs to its feed-forward network: a different ffn gets its own default.
        if "ffn" in user and "d_ff" in out and "d_ff" not in user:
            preset_ffn = out["ffn"].item.value.name if "ffn" in out else SLOTS["ffn"]
            if user["ffn"].item.value.name != preset_ffn:
                del out["d_ff"]
        return out

    def model_key(self, arg: Arg) -> Any:
        origin = self.values.get(arg.name)
        if origin is None:
            if arg.required:
                start = self.preset_item.start if self.preset_item else 0
                end = self.preset_item.end if self.preset_item else len(self.text)
                raise SpecError(
                    f"missing {arg.name} ({arg.help}); add {arg.name}=... or start with a preset: "
                    f"{one_of(self.registry.preset_names())}",
                    self.text,
                    start,
                    end,
                )
            return arg.default
        value = origin.item.value
        if value.scalar is None and not value.is_plain_name:
            raise self.fail(
                f"{arg.name} takes a plain {arg.type.__name__}, not a component",
                origin,
                whole_value=True,
            )
        raw = value.scalar if value.scalar is not None else value.name
        try:
            return arg.check(raw)
        except (TypeError, ValueError) as e:
            raise self.fail(f"{arg.name} {e}", origin, whole_value=True) from None

    def component(self, kind: str) -> tuple[Component, ComponentSpec]:
        origin = self.values.get(kind)
        value = _Value(0, 0, name=SLOTS[kind], args=()) if origin is None else origin.item.value
        if value.name is None:
            assert origin is not None  # the default slot value is a name
            raise self.fail(
                f"{kind} takes a component, e.g. {kind}={SLOTS[kind]} or "
                f"{kind}=name(arg=value); got {format_scalar(cast(Scalar, value.scalar))!r}; "
                f"available {kind}: {one_of(self.registry.names(kind))}",
                origin,
                whole_value=True,
            )
        try:
            entry = self.registry.get(kind, value.name, value.provider)
        except RegistryError as e:
            if origin is None:
                raise SpecError(f"default {kind} {value.name!r} is unavailable: {e}") from e
            raise self.fail(str(e), origin, whole_value=True) from e
        comp = entry.component
        given = {name: (raw, start, end) for name, raw, start, end in value.args or ()}
        accepted = [a.name for a in comp.args] + (["d_ff"] if kind == "ffn" else [])
        for name, (_, start, end) in given.items():
            if name not in accepted:
                raise self._arg_error(
                    f"{kind} {comp.name!r} has no argument {name!r}{did_you_mean(name, accepted)}; "
                    f"it takes: {one_of(accepted)}",
                    origin,
                    start,
                    end,
                )
        resolved: list[tuple[str, Scalar]] = []
        # d_ff is a model key that an ffn may also take as an argument; resolve() hoists it.
        for a in ((_KEY_ARGS["d_ff"],) if kind == "ffn" else ()) + comp.args:
            if a.name in given:
                raw, start, end = given[a.name]
                try:
                    resolved.append((a.name, a.check(raw)))
                except (TypeError, ValueError) as err:
                    raise self._arg_error(
                        f"argument {a.name!r} of {kind} {comp.name!r} {err}", origin, start, end
                    ) from None
            elif a.name == "d_ff":
                continue  # not given here: the model key or the ffn's default decides
            elif a.required:
                assert origin is not None  # defaults have no required arguments
                raise self.fail(
                    f"{kind} {comp.name!r} needs argument {a.name!r} "
                    f"({a.type.__name__}: {a.help}); "
                    f"write {kind}={comp.name}({a.name}=...)",
                    origin,
                    whole_value=True,
                )
            else:
                resolved.append((a.name, a.default))
        provider = (
            entry.provenance.qualifier if self.registry.is_ambiguous(kind, comp.name) else None
        )
        return comp, ComponentSpec(comp.name, tuple(resolved), provider)

    def _arg_error(self, message: str, origin: _Origin | None, start: int, end: int) -> SpecError:
        assert origin is not None
        if origin.preset is not None:
            return self.fail(message, origin)
        return SpecError(message, origin.text, start, end)

    def num_kv_heads(self, keys: dict[str, Any]) -> int:
        if "num_kv_heads" not in self.values:
            return int(keys["num_heads"])
        value: int = self.model_key(_KEY_ARGS["num_kv_heads"])
        if keys["num_heads"] % value:
            raise self.fail(
                f"num_kv_heads={value} must divide num_heads={keys['num_heads']} "
                "(each key/value head serves a whole group of query heads)",
                self.values["num_kv_heads"],
                whole_value=True,
            )
        return value

    def d_ff(self, keys: dict[str, Any], ffn: Component, from_arg: Scalar | None) -> int:
        if from_arg is not None:
            if "d_ff" in self.values and self.values["d_ff"].preset is None:
                raise self.fail(
                    "d_ff is given twice: as a model key and as an argument of ffn; keep one",
                    self.values["d_ff"],
                )
            return int(from_arg)
        if "d_ff" in self.values:
            value: int = self.model_key(_KEY_ARGS["d_ff"])
            return value
        if ffn.default_d_ff is not None:
            return int(ffn.default_d_ff(keys["d_model"]))
        return 4 * int(keys["d_model"])

    def check_shape(
        self, keys: dict[str, Any], comps: dict[str, tuple[Component, ComponentSpec]]
    ) -> None:
        d_model, heads = keys["d_model"], keys["num_heads"]
        if d_model % heads:
            near = [h for h in range(1, d_model + 1) if d_model % h == 0]
            near.sort(key=lambda h: abs(h - heads))
            raise self.fail(
                f"d_model={d_model} is not divisible by num_heads={heads}; "
                f"num_heads that divide it: {', '.join(map(str, sorted(near[:4])))}",
                self.values.get("num_heads") or self.values["d_model"],
                whole_value=True,
            )
        dims = {
            "d_model": d_model,
            "d_ff": keys["d_ff"],
            "num_heads": heads,
            "num_kv_heads": keys["num_kv_heads"],
            "head_dim": d_model // heads,
            "context_length": keys["context_length"],
        }
        for kind, (comp, spec) in comps.items():
            try:
                comp.check_shape(**{k: dims[k] for k in DIMS[kind]}, **spec.kwargs)
            except ValueError as e:
                # Blame what the user wrote: the slot itself, else the dimensions it is built for.
                culprit = next(
                    (k for k in (kind, "num_heads", "d_model", *DIMS[kind]) if self._by_user(k)),
                    kind,
                )
                raise self._slot_error(culprit, f"{kind} {comp.name!r}: {e}") from None
        pos, attn = comps["pos"][0], comps["attn"][0]
        if "bias" in pos.features and "bias" not in attn.features:
            able = [e.name for e in self.registry.entries("attn") if "bias" in e.component.features]
            raise self._slot_error(
                "attn",
                f"attn {attn.name!r} cannot take the additive attention bias that pos "
                f"{pos.name!r} produces; kernels that can: {one_of(able)}",
            )

    def _by_user(self, key: str) -> bool:
        return key in self.values and self.values[key].preset is None

    def _slot_error(self, kind: str, message: str) -> SpecError:
        origin = self.values.get(kind)
        if origin is None:
            if self.preset_item is not None:
                return SpecError(message, self.text, self.preset_item.start, self.preset_item.end)
            return SpecError(message, self.text, 0, len(self.text))
        return self.fail(message, origin, whole_value=True)


def _replace_args(spec: ComponentSpec, args: dict[str, Scalar]) -> ComponentSpec:
    return ComponentSpec(spec.name, tuple(args.items()), spec.provider)
