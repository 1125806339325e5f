"""The per-layer items, `key[layers]=value`: each layer's value of a key that differs by layer,
and the canonical whole-model value the spec then writes (chosen as `lmcore.spec` says)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmcore.blueprint.derived import d_ff_argument, width
from lmcore.blueprint.lookup import PartLookup
from lmcore.blueprint.origins import Origin, Origins
from lmcore.blueprint.resolved import SLOT_KINDS
from lmcore.components import REQUIRED
from lmcore.errors import SpecError, ValueProblem
from lmcore.parts import Part
from lmcore.spec import (
    KEY_ARGS,
    LAYER_KEYS,
    MAX_LAYERED,
    SLOTS,
    LayerValue,
    canonical_base,
    default_query_scale,
    layer_groups,
)
from lmcore.syntax import Value

LayerParts = tuple[tuple[str, tuple[int, ...], Part | None], ...]


@dataclass
class _Layered:
    """A key's value on every layer, and which item set it there (None: the whole-model one)."""

    values: list[Any]
    parts: list[Part | None]
    origins: list[Origin | None]


class PerLayer:
    """The per-layer items of one resolution, applied to its whole-model values."""

    def __init__(self, origins: Origins, lookup: PartLookup):
        self.origins = origins
        self.lookup = lookup

    def apply(
        self, values: dict[str, Any], parts: dict[str, Part]
    ) -> tuple[tuple[LayerValue, ...], LayerParts]:
        """Apply the `key[layers]=value` items to the whole-model `values` (and `parts`), then
        choose each varying key's canonical whole-model value (`lmcore.spec`); both dicts are
        updated to it. Returns the per-layer differences and the parts they hold."""
        layered = self.origins.layered
        if not layered:
            return (), ()
        n = values["num_layers"]
        if n > MAX_LAYERED:
            first = next(iter(layered.values()))[0]
            raise self.origins.fail(
                f"a spec with per-layer values has at most {MAX_LAYERED:,} layers; this one has "
                f"num_layers={n:,}",
                first,
                *first.item.layers_span,
            )
        table: dict[str, _Layered] = {}
        for key, origins in layered.items():
            lay = _Layered([values[key]] * n, [parts.get(key)] * n, [None] * n)
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
                    self.origins.blame[key, i] = setter
            for group in layer_groups(key, lay.values, whole):
                layers.append(group)
                if key in SLOT_KINDS:
                    layer_parts.append((key, group.layers, lay.parts[group.layers[0]]))
        order = {key: n for n, key in enumerate(LAYER_KEYS)}
        layers.sort(key=lambda lv: (order[lv.key], lv.layers[0]))
        return tuple(layers), tuple(layer_parts)

    def select(self, key: str, origin: Origin, n: int, lay: _Layered) -> list[int]:
        """The layers `origin` (a `key[layers]=value` item) names: each once, none that another
        item of the same spec (or of the same preset) gave `key` already."""
        seen: set[int] = set()
        for r in origin.item.layers or ():
            try:
                picked = r.select(n)
            except ValueProblem as e:
                raise self.origins.fail(f"{key}[...]: {e}", origin, r.begin, r.end) from None
            for i in picked:
                if i in seen:
                    raise self.origins.fail(
                        f"{key}[...] selects layer {i} twice; name each layer once",
                        origin,
                        r.begin,
                        r.end,
                    )
                seen.add(i)
                earlier = lay.origins[i]
                if earlier is not None and (earlier.preset is None) == (origin.preset is None):
                    raise self.origins.fail(
                        f"layer {i} gets {key} twice (from {key}[...] at position "
                        f"{earlier.item.start} and here); keep one",
                        origin,
                        *origin.item.layers_span,
                    )
        return sorted(seen)

    def layer_value(self, key: str, origin: Origin) -> tuple[Any, Part | None]:
        """The canonical value of a `key[layers]=value` item, and its part for a component."""
        if key == "qk_norm":
            part = self.lookup.qk_norm(origin)
            return (None if part is None else part.spec), part
        if key in SLOTS:
            part = self.lookup.part(SLOT_KINDS[key], origin.item.value, origin, key)
            return part.spec, part
        return self.origins.check_key(KEY_ARGS[key], origin), None

    def ffn_width(
        self,
        origin: Origin,
        chosen: list[int],
        values: dict[str, Any],
        parts: dict[str, Part],
        table: dict[str, _Layered],
        n: int,
    ) -> None:
        """`ffn[layers]=name(d_ff=...)`: the width belongs to `d_ff` on those layers, as a
        whole-model ffn's belongs to the model's `d_ff`."""
        value = origin.item.value
        given = d_ff_argument(value)
        if given is None:
            return
        raw, start, end = given
        try:
            d_ff = width(raw)
        except ValueProblem as e:
            raise self.origins.fail(
                f"argument 'd_ff' of ffn {value.name!r} {e}", origin, start, end
            ) from None
        lay = table.get("d_ff") or _Layered([values["d_ff"]] * n, [None] * n, [None] * n)
        for i in chosen:
            if lay.origins[i] is not None and lay.origins[i] is not origin:
                raise self.origins.fail(
                    f"d_ff of layer {i} is given twice: by d_ff[...] and as an argument of "
                    "ffn[...]; keep one",
                    origin,
                    start,
                    end,
                )
            lay.values[i], lay.origins[i] = d_ff, origin
        table["d_ff"] = lay

    def default_of(self, key: str, values: dict[str, Any]) -> Any:
        """`key`'s default for choosing the canonical whole-model value (REQUIRED: none)."""
        if key in SLOTS:
            try:
                value = Value(0, 0, name=SLOTS[key], args=())
                return self.lookup.part(key, value, None, key).spec
            except SpecError:
                return REQUIRED
        if key == "query_scale":
            return default_query_scale(values["head_dim"])
        if key == "d_ff":
            return REQUIRED
        return KEY_ARGS[key].default
