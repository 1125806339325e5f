"""The values a spec may leave out because lmcore derives them: `num_kv_heads`, `head_dim`, the
query scale and the feed-forward width `d_ff`.

The one `d_ff` rule. An ffn may be given its width as an argument (`swiglu(d_ff=512)`; no
component declares `d_ff`, lmcore passes it): `d_ff_argument` finds it and `width` checks it as
the `d_ff` key is checked, wherever an ffn is written: the whole model's (`ffn=`: the model's
`d_ff`), some layers' (`ffn[layers]=`: those layers' `d_ff`, in `lmcore.blueprint.layers`) and a
nested one's (`moe(shared=swiglu(d_ff=...))`: its own, in `lmcore.blueprint.lookup`). The
model's width is, first match: the ffn's argument, the `d_ff` key, the ffn's
`default_d_ff(d_model)`, else 4·d_model (`d_ff` below, the one place a default width is
computed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lmcore.blueprint.origins import Origin, Origins
from lmcore.components import Scalar
from lmcore.errors import PluginError, ValueProblem, ValueTypeProblem
from lmcore.parts import Part
from lmcore.spec import KEY_ARGS, SLOTS, default_query_scale
from lmcore.syntax import MAX_INT, Value


def derived(
    origins: Origins, values: Mapping[str, Any], ffn: Part, preset: Mapping[str, Origin]
) -> dict[str, Any]:
    """`num_kv_heads`, `head_dim`, `query_scale` and `d_ff`: each the spec's value where it gives
    one, else derived from the model's other `values` and its `ffn`. `preset` holds the preset's
    items, for whose ffn its `d_ff` is meant."""
    d_model, heads = values["d_model"], values["num_heads"]
    out: dict[str, Any] = {"num_kv_heads": num_kv_heads(origins, heads)}  # errors in this order
    out["head_dim"] = origins.given("head_dim", d_model // heads)
    out["query_scale"] = origins.given("query_scale", default_query_scale(out["head_dim"]))
    out["d_ff"] = d_ff(origins, d_model, ffn, preset)
    return out


def num_kv_heads(origins: Origins, num_heads: int) -> int:
    if "num_kv_heads" not in origins.values:
        return num_heads
    value: int = origins.model_key(KEY_ARGS["num_kv_heads"])
    if num_heads % value:
        raise origins.fail(
            f"num_kv_heads={value} must divide num_heads={num_heads} "
            "(each key/value head serves a whole group of query heads)",
            origins.values["num_kv_heads"],
        )
    return value


def d_ff_argument(value: Value) -> tuple[Scalar | Value, int, int] | None:
    """The `d_ff=` argument written in an ffn's `value`, as `(value, start, end)`; None if none."""
    return next(((raw, s, e) for name, raw, s, e in value.args or () if name == "d_ff"), None)


def width(raw: Scalar | Value) -> int:
    """A width written as an ffn's `d_ff=` argument, checked as the `d_ff` key is; a
    `ValueProblem` saying what is wrong."""
    if isinstance(raw, Value):
        raise ValueTypeProblem("expects int, got a component")
    return int(KEY_ARGS["d_ff"].check(raw))


def d_ff(origins: Origins, d_model: int, ffn: Part, preset: Mapping[str, Origin]) -> int:
    """The model's feed-forward width, by the rule above.

    A preset's `d_ff` belongs to the preset's ffn: a spec that switches to another ffn
    without giving `d_ff` gets the new ffn's default.
    """
    arg = KEY_ARGS["d_ff"]
    origin = origins.values.get("ffn")
    given = d_ff_argument(origin.item.value) if origin is not None else None
    if origin is not None and given is not None:
        raw, start, end = given
        if origins.by_user("d_ff"):
            key = origins.values["d_ff"]
            raise origins.fail(
                "d_ff is given twice: as a model key and as an argument of ffn; keep one",
                key,
                key.item.start,
                key.item.end,
            )
        try:
            return width(raw)
        except ValueProblem as e:
            message = f"argument 'd_ff' of ffn {ffn.name!r} {e}"
            raise origins.fail(message, origin, start, end) from None
    preset_ffn = preset["ffn"].item.value.name if "ffn" in preset else SLOTS["ffn"]
    if "d_ff" in origins.values and (origins.by_user("d_ff") or ffn.name == preset_ffn):
        value: int = origins.model_key(arg)
        return value
    try:
        default = ffn.entry.count("default_d_ff", {"d_model": d_model})
    except PluginError as e:
        raise origins.at_slot("ffn", str(e)) from e
    source = f"default_d_ff of ffn {ffn.name!r} from {ffn.provenance}"
    if default is None:
        default, source = 4 * d_model, "the default d_ff = 4·d_model"
    try:
        value = int(arg.check(default))
    except ValueProblem as e:
        raise origins.at_slot("ffn", f"{source} gave d_ff {e}") from None
    if value > MAX_INT:  # the canonical form must parse back
        raise origins.at_slot(
            "ffn",
            f"{source} gives d_ff={value:,}, beyond the largest integer a spec can hold "
            f"(2**63 - 1); give d_ff=... explicitly",
        )
    return value
