"""Numbers and values of a config.json, checked before they are used: `checked` (a positive
int or float, an integer within 64 bits, a float within its range, by field name), `spread`
(which layers a per-layer field covers, without a step per layer when all or none do), and how
a value is shown in a message (`json_text`, abbreviated: a 400-digit integer is its first
digits and its length)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from lmcore.components import REQUIRED
from lmcore.spec import MAX_INT, MAX_LAYERED

__all__ = ["checked", "either", "json_text", "one_of", "same", "spread", "too_many"]


def json_text(value: Any) -> str:
    """`value` as JSON writes it, abbreviated past 80 characters (a 400-digit integer is its
    first digits and its length)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        digits = len(str(abs(value)))
        return f"{str(value)[:12]}...({digits:,} digits)"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = f"<a {type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def same(a: Any, b: Any) -> bool:
    """Equal values of the same JSON kind: `false` is not `0` (`False == 0` in Python)."""
    return (isinstance(a, bool) == isinstance(b, bool)) and a == b


def one_of(value: Any, allowed: Iterable[Any]) -> bool:
    """`value` is `same` as one of `allowed`."""
    return any(same(value, a) for a in allowed)


def either(values: Iterable[Any]) -> str:
    """The values as a message lists choices: `"a" or "b"`."""
    shown = list(dict.fromkeys(json_text(v) for v in values))
    return " or ".join(shown)


def checked(name: str, value: Any, kind: type, problems: list[str], *, zero: bool = False) -> Any:
    """`value` of config field `name` if it is a `kind` (int, float or bool; numbers finite and
    positive, or zero when `zero`), else None with the problem named in `problems`."""
    if value is REQUIRED:
        problems.append(f"{name} is missing")
        return None
    if kind is bool:
        if type(value) is bool:
            return value
        problems.append(f"{name}={json_text(value)} is not true or false")
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and number and isinstance(value, float) and value.is_integer():
        value = int(value)  # 4096.0, as some exporters write integers
    # JSON numbers have no bound: an integer past MAX_INT, or past a float's range where a
    # float is read, is refused here, by name, before it reaches a float() or a size.
    limit = ""
    if number and kind is float:
        try:
            value = float(value)
        except OverflowError:
            limit = " (it is beyond a float's range, about 1.8e308)"
    elif number and isinstance(value, int) and abs(value) > MAX_INT:
        limit = f" (at most 2**63 - 1 = {MAX_INT:,})"
    ok = (
        number
        and not limit
        and (kind is float or isinstance(value, int))
        and math.isfinite(value)
        and (value > 0 or (zero and value == 0))
    )
    if ok:
        return value
    what = "non-negative" if zero else "positive"
    problems.append(f"{name}={json_text(value)} is not a {what} {kind.__name__}{limit}")
    return None


def spread(n: int, on: range | Sequence[bool], but: Iterable[int] = ()) -> bool | list[bool] | None:
    """Which of `n` layers are on: `on` a range of layer indices (less the indices `but`, a
    list a config gives), or one flag per layer (a config's `layer_types`). True or False when
    all or none are, with no work per layer (a config may say 10**12 layers); else one flag per
    layer when the spec can say it (at most `MAX_LAYERED` layers), else None."""
    if isinstance(on, range):
        out = {i for i in but if i in on}
        count = len(on) - len(out)
        if count in (0, n):
            return count == n
        if n > MAX_LAYERED:
            return None
        return [i in on and i not in out for i in range(n)]
    flags = list(on)
    if all(flags) or not any(flags):
        return all(flags)
    return flags if n <= MAX_LAYERED else None


def too_many(n: int, what: str) -> str:
    """The problem of `what` differing by layer on more layers than a spec lists."""
    return (
        f"{what} on some of its {n:,} layers and not on others: lmcore's spec gives per-layer "
        f"values to at most {MAX_LAYERED:,} layers"
    )
