"""The spec grammar and its data: `ModelSpec`, `ComponentSpec` and the parser behind them.

    spec      := item ("," item)*             the first item may be a preset name
    item      := qualname | key "=" value
    value     := scalar | qualname ["(" [arg ("," arg)*] ")"]
    arg       := name "=" scalar
    scalar    := integer | float | true | false | name | quoted string
    qualname  := [dist ":"] name              dist: a name, or quoted ("2norms":rmsnorm)

Integers lie within ±(2**63 - 1) and a number has at most 64 characters, so no value can
overflow and no work grows with a value's size; parsing is linear in the text's length.
This module knows the syntax only; `lmcore.blueprint.resolve` gives the items their meaning
against the registry (presets, components, defaults). `str(spec)` is canonical: preset expanded,
every key in a fixed order, every component argument written out, no spaces. Nothing in a spec is
evaluated or imported.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, NamedTuple

from lmcore.components import (
    DIMS,
    NAME_RE,
    REQUIRED,
    Arg,
    Scalar,
    format_qualified,
    format_scalar,
)
from lmcore.errors import SpecError, clip

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
        qualified = format_qualified(self.provider, self.name)
        if not self.args:
            return qualified
        inner = ",".join(f"{k}={format_scalar(v)}" for k, v in self.args)
        return f"{qualified}({inner})"


@dataclass(frozen=True)
class ModelSpec:
    """A fully resolved model: every hyperparameter and component, defaults filled in.

    Build one with `lmcore.parse_spec` (or `lmcore.resolve(...).spec`); `str(spec)` is its
    canonical spec string.
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
        return {k: getattr(self, k) for k in DIMS[kind]}

    def __str__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            text = str(value) if isinstance(value, ComponentSpec) else format_scalar(value)
            parts.append(f"{f.name}={text}")
        return ",".join(parts)


# Model keys in canonical order. num_kv_heads and d_ff have derived defaults (lmcore.blueprint).
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
# The component slots and the component each defaults to, in canonical order.
SLOTS: Final[Mapping[str, str]] = {
    "norm": "rmsnorm",
    "ffn": "swiglu",
    "pos": "rope",
    "attn": "sdpa",
}
KEY_ARGS: Final[Mapping[str, Arg]] = {a.name: a for a in MODEL_KEYS}
ALL_KEYS: Final = (*KEY_ARGS, *SLOTS)

# ------------------------------------------------------------------------------ tokens

# Numbers are bounded, so no value overflows a float, torch's 64-bit sizes or Python's
# int/str conversion limit, and no work depends on a value's magnitude.
MAX_INT: Final = 2**63 - 1
MAX_NUMBER_CHARS: Final = 64

_NUMBER = re.compile(
    r"[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?\Z"
)
_STRING = {q: re.compile(rf"{q}((?:[^{q}\\]|\\.)*){q}", re.S) for q in "\"'"}
_ESCAPE = re.compile(r"\\(.?)", re.S)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


class _Tok(NamedTuple):
    kind: str  # name | number | string | bool | punct | end
    text: str
    start: int
    end: int
    value: Any = None


_TOKEN = re.compile(  # one match per token, with the whitespace before it
    r"\s*(?:(?P<punct>[,=():])"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?![A-Za-z0-9_.+\-])"  # names: the common case
    r"|(?P<word>[A-Za-z0-9_.+\-]+)"  # numbers, and what is neither
    r"|(?P<quote>[\"'])"
    r"|(?P<other>.))",
    re.S,
)


def _tokenize(src: str) -> list[_Tok]:
    """Tokens in one pass of regular expressions, each linear in its length."""
    toks: list[_Tok] = []
    i, n = 0, len(src)
    while (m := _TOKEN.match(src, i)) is not None:  # None: only whitespace is left
        kind = m.lastgroup or "other"
        start, i, text = m.start(kind), m.end(), m.group(kind)
        if kind == "punct":
            toks.append(_Tok("punct", text, start, i))
        elif kind == "name" and text not in ("true", "false"):
            toks.append(_Tok("name", text, start, i, text))
        elif kind in ("name", "word"):
            toks.append(_word(src, text, start))
        elif kind == "quote":
            toks.append(_string(src, start))
            i = toks[-1].end
        else:
            raise SpecError(
                f"unexpected character {text!r}; "
                "specs use names, numbers, quoted strings and , = ( ) :",
                src,
                start,
            )
    toks.append(_Tok("end", "", n, n))
    return toks


def _string(src: str, start: int) -> _Tok:
    quote = src[start]
    m = _STRING[quote].match(src, start)
    if m is None:
        raise SpecError(f"unterminated string: add the closing {quote}", src, start, len(src))

    def unescape(e: re.Match[str]) -> str:
        if e.group(1) not in _ESCAPES:
            raise SpecError(
                f"unknown escape '\\{e.group(1)}' in a quoted string; "
                f"use \\\\, \\{quote}, \\n or \\t",
                src,
                start + 1 + e.start(),
                start + 1 + e.end(),
            )
        return _ESCAPES[e.group(1)]

    return _Tok("string", m.group(), start, m.end(), _ESCAPE.sub(unescape, m.group(1)))


def _word(src: str, text: str, start: int) -> _Tok:
    end = start + len(text)
    if text[0].isdigit() or text[0] in "+-.":
        if not _NUMBER.match(text):
            quote = f' (quote a distribution name that is not a plain name: "{_short(text)}":...)'
            raise SpecError(
                f"malformed number {clip(text)}; names start with a letter or '_', numbers look "
                "like 10000, 10_000, 1e-5 or 0.5" + (quote if src[end : end + 1] == ":" else ""),
                src,
                start,
                end,
            )
        if len(text) > MAX_NUMBER_CHARS:
            raise SpecError(
                f"number {clip(text)} is too long: a spec's numbers have at most "
                f"{MAX_NUMBER_CHARS} characters",
                src,
                start,
                end,
            )
        plain = text.replace("_", "")
        if "." in plain or "e" in plain or "E" in plain:
            value = float(plain)
            if not math.isfinite(value):
                raise SpecError(f"number {text!r} is out of range", src, start, end)
            return _Tok("number", text, start, end, value)
        if abs(number := int(plain)) > MAX_INT:
            raise SpecError(
                f"integer {text} is out of range: a spec's integers lie within "
                f"±(2**63 - 1) = ±{MAX_INT:,}",
                src,
                start,
                end,
            )
        return _Tok("number", text, start, end, number)
    if text in ("true", "false"):
        return _Tok("bool", text, start, end, text == "true")
    if not NAME_RE.match(text):
        raise SpecError(
            f"invalid name {clip(text)}: names are letters, digits, '_', '-' and '.', "
            "starting with a letter or '_'",
            src,
            start,
            end,
        )
    return _Tok("name", text, start, end, text)


# ------------------------------------------------------------------------------ syntax


class Value(NamedTuple):  # tuples: a spec of 100,000 items builds quickly
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


class Item(NamedTuple):
    """One `key=value` item, or the preset item (`key` None), with its position in the text."""

    key: str | None
    start: int  # of the key (or the preset name)
    end: int
    value: Value


def parse_items(src: str) -> list[Item]:
    """The items of a spec string, syntax only; `SpecError` with a caret for malformed text."""
    return _Parser(src).parse()


class _Parser:
    def __init__(self, src: str):
        self.src = src
        self.toks = _tokenize(src)
        self.i, self.last = 0, len(self.toks) - 1

    def peek(self, ahead: int = 0) -> _Tok:
        return self.toks[min(self.i + ahead, self.last)]

    def take(self) -> _Tok:
        tok = self.peek()
        self.i += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind == "punct" and tok.text == text

    def error(self, message: str, tok: _Tok) -> SpecError:
        return SpecError(message, self.src, tok.start, tok.end)

    def expect(self, text: str, what: str) -> _Tok:
        if not self.at(text):
            raise self.error(f"expected {what}, found {_show(self.peek())}", self.peek())
        return self.take()

    def parse(self) -> list[Item]:
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

    def item(self) -> Item:
        tok = self.peek()
        if tok.kind == "name" and self.peek(1).kind == "punct" and self.peek(1).text == "=":
            self.take()
            self.take()
            return Item(tok.text, tok.start, tok.end, self.value())
        if tok.kind == "name" or self.qualifier_ahead():
            value = self.value()
            if value.args is not None:
                raise SpecError(
                    f"{clip(tok.text)} takes no arguments here: a bare name is a preset; "
                    f"components go in slots, e.g. norm={_short(tok.text)}(...)",
                    self.src,
                    tok.start,
                    value.end,
                )
            return Item(None, value.start, value.end, value)
        raise self.error(f"expected key=value or a preset name, found {_show(tok)}", tok)

    def qualifier_ahead(self) -> bool:
        """A quoted distribution name before ':' (`"2norms":rmsnorm`) qualifies a name."""
        ahead = self.peek(1)
        return self.peek().kind == "string" and ahead.kind == "punct" and ahead.text == ":"

    def value(self) -> Value:
        quoted = self.qualifier_ahead()
        tok = self.take()
        if tok.kind in ("number", "string", "bool") and not quoted:
            return Value(tok.start, tok.end, scalar=tok.value)
        if tok.kind != "name" and not quoted:
            raise self.error(
                f"expected a value (number, true/false, name or quoted string), found {_show(tok)}",
                tok,
            )
        provider, name = None, tok
        if self.at(":"):
            self.take()
            name = self.take()
            if name.kind != "name":
                raise self.error(
                    f"expected a name after {clip(tok.text + ':')}, found {_show(name)}", name
                )
            provider = tok.value
        if not self.at("("):
            return Value(tok.start, name.end, name=name.text, provider=provider)
        self.take()
        args: list[tuple[str, Scalar, int, int]] = []
        seen: set[str] = set()
        while not self.at(")"):
            if args:
                self.expect(",", "',' or ')' in the argument list")
            key = self.take()
            if key.kind != "name":
                raise self.error(f"expected an argument name, found {_show(key)}", key)
            if key.text in seen:
                raise self.error(f"argument {clip(key.text)} is given twice", key)
            seen.add(key.text)
            self.expect("=", f"'=' after argument {clip(key.text)}")
            val = self.take()
            if val.kind not in ("number", "string", "bool", "name"):
                raise self.error(f"expected a value for {clip(key.text)}, found {_show(val)}", val)
            if self.at(":") or self.at("("):
                raise self.error("argument values are plain values, not components", self.peek())
            args.append((key.text, val.value, key.start, val.end))
        close = self.take()
        return Value(tok.start, close.end, name=name.text, provider=provider, args=tuple(args))


def _short(text: str) -> str:
    """`text` as it is when short, else `name`: for examples in messages."""
    return text if len(text) <= 40 else "name"


def _show(tok: _Tok) -> str:
    return "end of spec" if tok.kind == "end" else clip(tok.text)
