"""The spec grammar: a spec's text read into items with their positions (for the caret).

    spec      := item ("," item)*             the first item may be a preset name
    item      := qualname | key [layers] "=" value
    layers    := "[" range ("," range)* "]"   layer indices: 3, -1, 2:5, 1::2, :4 (Python slices)
    value     := scalar | qualname ["(" [arg ("," arg)*] ")"]
    arg       := name "=" value               a value may be a component: expert=swiglu(d_ff=64)
    scalar    := integer | float | true | false | name | quoted string
    qualname  := [dist ":"] name              dist: a name, or quoted ("2norms":rmsnorm)

Integers lie within ±(2**63 - 1) and a number has at most 64 characters, so no value can
overflow and no work grows with a value's size; parsing is linear in the text's length, and
components nest at most `MAX_DEPTH` deep. This module knows the syntax only; `lmcore.spec`
holds the model's data and its canonical form, and `lmcore.blueprint.resolve` gives the items
their meaning against the registry (presets, components, defaults, layer indices). Nothing in a
spec is evaluated or imported.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final, NamedTuple

from lmcore.components import NAME_RE, Scalar
from lmcore.errors import SpecError, ValueProblem, clip

# Components nest at most this deep (`moe(expert=swiglu)` is 2).
MAX_DEPTH: Final = 8

# ------------------------------------------------------------------------------ layers


class LayerRange(NamedTuple):
    """One range of a layer selection as written: an index (`stop`, `step` unused) or a slice."""

    start: int | None
    stop: int | None
    step: int | None
    single: bool  # an index on its own, not a slice
    begin: int  # its span in the text
    end: int

    def select(self, num_layers: int) -> list[int]:
        """The layers it names, by Python's indexing rules (a negative index counts from the end;
        a slice is clipped to the model); a `ValueProblem` saying what cannot work."""
        if self.single:
            if self.start is None or not -num_layers <= self.start < num_layers:
                raise ValueProblem(
                    f"layer {self.start} is out of range: num_layers={num_layers}, so layers are "
                    f"0..{num_layers - 1} (or -{num_layers}..-1 from the end)"
                )
            return [self.start % num_layers]
        if self.step is not None and self.step < 1:
            raise ValueProblem(
                f"a layer range's step must be at least 1, got {self.step} (e.g. 1::2)"
            )
        chosen = list(range(num_layers)[slice(self.start, self.stop, self.step)])
        if not chosen:
            raise ValueProblem(
                f"selects no layer of the {num_layers} (layers are 0..{num_layers - 1})"
            )
        return chosen


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
    r"\s*(?:(?P<punct>[,=():\[\]])"
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
                "specs use names, numbers, quoted strings and , = ( ) : [ ]",
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
    """A parsed value: a scalar, or a (qualified) name with an optional argument list, whose
    values are scalars (a plain name as its string) or nested `Value`s."""

    start: int
    end: int
    scalar: Scalar | None = None  # set for numbers, strings, bools
    name: str | None = None
    provider: str | None = None
    args: tuple[tuple[str, Scalar | Value, int, int], ...] | None = (
        None  # (name, value, start, end)
    )

    @property
    def is_plain_name(self) -> bool:
        return self.name is not None and self.provider is None and self.args is None


class Item(NamedTuple):
    """One `key=value` item (`key[layers]=value` for some layers), or the preset item (`key`
    None), with its position in the text."""

    key: str | None
    start: int  # of the key (or the preset name)
    end: int
    value: Value
    layers: tuple[LayerRange, ...] | None = None
    layers_span: tuple[int, int] = (0, 0)  # from '[' to ']'


def parse_items(src: str) -> list[Item]:
    """The items of a spec string, syntax only; `SpecError` with a caret for malformed text."""
    return _Parser(src).parse()


def parse_value(src: str) -> Value:
    """One value on its own (`swiglu`, `rmsnorm(eps=1e-6)`), e.g. a component-valued
    argument's default; `SpecError` with a caret for malformed text."""
    parser = _Parser(src)
    if parser.peek().kind == "end":
        raise parser.error(
            "empty value; write a name, e.g. swiglu, or name(arg=value)", parser.peek()
        )
    value = parser.value()
    if parser.peek().kind != "end":
        raise parser.error(
            f"expected the end of the value, found {_show(parser.peek())}", parser.peek()
        )
    return value


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
        after = self.peek(1)
        if tok.kind == "name" and after.kind == "punct" and after.text in ("=", "["):
            self.take()
            if after.text == "=":
                self.take()
                return Item(tok.text, tok.start, tok.end, self.value())
            layers, span = self.layers()
            self.expect("=", f"'=' after {_short(tok.text)}[...]")
            return Item(tok.text, tok.start, tok.end, self.value(), layers, span)
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

    def layers(self) -> tuple[tuple[LayerRange, ...], tuple[int, int]]:
        """`[range, ...]`: layer indices and slices, as in Python (`3`, `-1`, `2:5`, `1::2`)."""
        opening = self.take()
        ranges = [self.layer_range()]
        while self.at(","):
            self.take()
            ranges.append(self.layer_range())
        closing = self.expect("]", "']' closing the layers (or ',' before another range)")
        return tuple(ranges), (opening.start, closing.end)

    def layer_range(self) -> LayerRange:
        first = self.peek()
        bounds: list[int | None] = [self.layer_number()]
        colons = 0
        while colons < 2 and self.at(":"):
            self.take()
            colons += 1
            bounds.append(self.layer_number())
        if colons == 0 and bounds[0] is None:
            raise self.error(
                f"expected a layer index or range (e.g. 3, -1, 2:5, 1::2), found {_show(first)}",
                first,
            )
        end = self.toks[self.i - 1].end
        start, stop, step = (*bounds, None, None)[:3]
        return LayerRange(start, stop, step, colons == 0, first.start, end)

    def layer_number(self) -> int | None:
        tok = self.peek()
        if tok.kind == "punct" or tok.kind == "end":
            return None
        if tok.kind != "number" or not isinstance(tok.value, int):
            raise self.error(
                f"layer indices are integers (e.g. 3, -1, 2:5, 1::2), found {_show(tok)}", tok
            )
        self.take()
        return tok.value

    def value(self, depth: int = 0) -> Value:
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
        if depth >= MAX_DEPTH:
            raise self.error(f"components nest at most {MAX_DEPTH} deep", self.peek())
        self.take()
        args: list[tuple[str, Scalar | Value, int, int]] = []
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
            ahead = self.peek()
            if ahead.kind not in ("number", "string", "bool", "name"):
                raise self.error(
                    f"expected a value for {clip(key.text)}, found {_show(ahead)}", ahead
                )
            val = self.value(depth + 1)
            # A scalar or a plain name is held as its value; anything else as the `Value`.
            arg: Scalar | Value = val
            if val.scalar is not None:
                arg = val.scalar
            elif val.is_plain_name and val.name is not None:
                arg = val.name
            args.append((key.text, arg, key.start, val.end))
        close = self.take()
        return Value(tok.start, close.end, name=name.text, provider=provider, args=tuple(args))


def _short(text: str) -> str:
    """`text` as it is when short, else `name`: for examples in messages."""
    return text if len(text) <= 40 else "name"


def _show(tok: _Tok) -> str:
    return "end of spec" if tok.kind == "end" else clip(tok.text)
