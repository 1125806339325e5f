"""Resolution, in order: parse the items (`lmcore.spec`); expand the preset; look up each
component and check its arguments (`lookup`); derive `num_kv_heads`, `head_dim`, `d_ff` and the
query scale (`derived`); apply the per-layer items (`layers`); check the shape (`checks`)."""

from __future__ import annotations

from lmcore.blueprint.checks import check_shape
from lmcore.blueprint.derived import derived
from lmcore.blueprint.layers import PerLayer
from lmcore.blueprint.lookup import PartLookup
from lmcore.blueprint.origins import Origin, Origins
from lmcore.blueprint.resolved import Blueprint
from lmcore.errors import RegistryError, SpecError, SpecTypeError, clip, did_you_mean
from lmcore.parts import Part
from lmcore.registry import Registry, get_registry
from lmcore.spec import ALL_KEYS, KEY_ARGS, LAYER_KEYS, SLOTS, ModelSpec
from lmcore.syntax import Item, parse_items

# Model keys with a plain default (the others are derived, or components).
_PLAIN_KEYS = tuple(
    a.name
    for a in KEY_ARGS.values()
    if a.kind is None and a.name not in ("num_kv_heads", "d_ff", "head_dim", "query_scale")
)


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


class _Resolver:
    """One resolution of spec `text`: the walk over its items and its preset's."""

    def __init__(self, text: str, registry: Registry):
        self.text = text
        self.registry = registry
        self.origins = Origins(text, registry)
        self.lookup = PartLookup(registry, self.origins)

    def resolve(self) -> Blueprint:
        origins = self.origins
        user, user_layered = self.collect(parse_items(self.text), None)
        preset, preset_layered = self.expand_preset()
        origins.values = {**preset, **user}
        for key in LAYER_KEYS:  # a user's key=value replaces the preset's key[layers] items too
            found = [
                *([] if key in user else preset_layered.get(key, [])),
                *user_layered.get(key, []),
            ]
            if found:
                origins.layered[key] = found
        values = {name: origins.model_key(KEY_ARGS[name]) for name in _PLAIN_KEYS}
        parts: dict[str, Part] = {slot: self.lookup.slot(slot) for slot in SLOTS}
        qk = self.lookup.qk_norm(origins.values.get("qk_norm"))
        if qk is not None:
            parts["qk_norm"] = qk
        adapter = self.lookup.optional("adapter", origins.values.get("adapter"), "adapter")
        if adapter is not None:
            parts["adapter"] = adapter
        rules = self.lookup.optional(
            "parametrization", origins.values.get("parametrization"), "parametrization"
        )
        if rules is not None:
            parts["parametrization"] = rules
        quant = self.lookup.optional("quant", origins.values.get("quant"), "quant")
        if quant is not None:
            parts["quant"] = quant
        values.update(derived(origins, values, parts["ffn"], preset))
        values.update({slot: part.spec for slot, part in parts.items()})
        values.setdefault("qk_norm", None)
        values.setdefault("adapter", None)
        values.setdefault("parametrization", None)
        values.setdefault("quant", None)
        layers, layer_parts = PerLayer(origins, self.lookup).apply(values, parts)
        spec = ModelSpec(**values, layers=layers)
        bp = Blueprint(spec, parts, self.registry, layer_parts)
        check_shape(origins, bp)
        return bp

    def collect(
        self, items: list[Item], preset: Item | None, text: str | None = None
    ) -> tuple[dict[str, Origin], dict[str, list[Origin]]]:
        """The items by key (`key=value`) and the per-layer ones (`key[layers]=value`) in order;
        the user's (`preset` None, recording the preset item) or the text of the preset that
        `preset` names (malformed: raised)."""
        plain: dict[str, Origin] = {}
        layered: dict[str, list[Origin]] = {}
        src = self.text if text is None else text

        def bad(message: str, item: Item) -> SpecError:
            if preset is not None:
                return self.origins.malformed(preset, message)
            return SpecError(message, self.text, item.start, item.end)

        for n, item in enumerate(items):
            if item.key is None:
                if preset is not None:
                    raise self.origins.malformed(preset, "it names another preset")
                if n > 0:
                    raise bad(
                        f"a bare name ({clip(item.value.name or '')}) is a preset and can only "
                        "come first; everything after it is key=value",
                        item,
                    )
                self.origins.preset_item = item
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
                layered.setdefault(item.key, []).append(Origin(src, item, preset))
            elif item.key in plain:
                raise bad(
                    f"key {item.key!r} is given twice (first at position "
                    f"{plain[item.key].item.start}); keep one",
                    item,
                )
            else:
                plain[item.key] = Origin(src, item, preset)
        return plain, layered

    def expand_preset(self) -> tuple[dict[str, Origin], dict[str, list[Origin]]]:
        """The preset's items, as `collect` gives them; none without a preset."""
        item = self.origins.preset_item
        if item is None:
            return {}, {}
        value = item.value
        try:
            entry = self.registry.get_preset(value.name or "", value.provider)
        except RegistryError as e:
            raise SpecError(str(e), self.text, value.start, value.end) from e
        try:
            items = parse_items(entry.preset.spec)
        except SpecError as e:
            raise self.origins.malformed(item, e.message) from e
        return self.collect(items, item, entry.preset.spec)
