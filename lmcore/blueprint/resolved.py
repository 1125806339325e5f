"""The `Blueprint`: a spec resolved against a registry, the canonical `ModelSpec` plus the `Part`
filling each component slot. Everything downstream takes one and never parses a spec again;
`kwargs(slot)` is the one rule for what a component's factory and declarations receive."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from lmcore.components import Component
from lmcore.parts import Part
from lmcore.registry import Entry, Provenance, Registry
from lmcore.spec import SLOTS, ModelSpec, format_layers

# The kind of component each slot holds; `qk_norm` is a norm; `adapter` an adapter.
SLOT_KINDS: Mapping[str, str] = {
    **{slot: slot for slot in SLOTS}, "qk_norm": "norm", "adapter": "adapter",
    "parametrization": "parametrization",
    "quant": "quant",
}


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
        (`num_heads · head_dim`; the key norm for `num_kv_heads · head_dim`). A block gets
        `feed_forward`: False when the layer's ffn declares 'empty' (`ffn=none`, `lmcore_blocks`).
        """
        part = self.parts[kind]
        if kind in ("adapter", "quant"):  # built per targeted matrix, for its widths (model.adapters)
            return part.kwargs()
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
        if kind == "block":  # ffn=none ('empty'): the block wires no feed-forward sub-layer
            kwargs["feed_forward"] = "empty" not in self.parts["ffn"].component.features
        return kwargs

    def create(self, kind: str, *, device: Any = None, dtype: Any = None, **extra: Any) -> Any:
        """Build one module of `kind` for this model: a `torch.nn.Module` implementing the
        kind's protocol, else a `PluginError` naming the component and its distribution. The
        module's outputs are checked (shape, dtype) on every call; see `checked_module`.
        `extra` adds to (or replaces) what `kwargs(kind)` gives, e.g. a block's modules."""
        return self.parts[kind].create(**{**self.kwargs(kind), **extra}, device=device, dtype=dtype)

    def attention_paths(self) -> tuple[str, ...]:
        """Where the layer's mixer keeps each attention sub-layer it builds (`Part.attention_paths`):
        ``("",)`` for the built-in `attention` mixer, none for a mixer without attention."""
        return self.parts["mixer"].attention_paths()

    def padding(self) -> tuple[str, str, list[str]] | None:
        """None when every layer takes left-padded batches; else `(kind, name, able)`: the
        first component that cannot (a mixer without the 'mask' feature, or the attention
        kernel of a layer whose mixer attends, without it) and the registered ones of its kind
        that can."""
        for _, lbp in self.groups():
            for part in lbp.parts["mixer"].walk():
                if part.kind == "mixer" and "mask" not in part.component.features:
                    return "mixer", part.name, _able(self.registry, "mixer")
            if lbp.attention_paths() and "mask" not in lbp.features("attn"):
                return "attn", lbp.component("attn").name, _able(self.registry, "attn")
        return None

    def documents(self) -> tuple[str, str, list[str]] | None:
        """None when every layer takes packed rows of documents (a document-masked forward);
        else `(kind, name, able)`: the first component that cannot (a mixer without the
        'documents' feature, or the attention kernel of a layer whose mixer attends, without
        it) and the registered ones of its kind that can."""
        for _, lbp in self.groups():
            for part in lbp.parts["mixer"].walk():
                if part.kind == "mixer" and "documents" not in part.component.features:
                    return "mixer", part.name, _able(self.registry, "mixer", "documents")
            if lbp.attention_paths() and "documents" not in lbp.features("attn"):
                name = lbp.component("attn").name
                return "attn", name, _able(self.registry, "attn", "documents")
        return None

    def norm_names(self) -> tuple[str, ...]:
        """The attribute names of the norms the block builds, from its `norms` declaration."""
        names = self.parts["block"].entry.invoke("norms", self.kwargs("block"))
        return tuple(names or ())

    @cached_property
    def layers(self) -> tuple[Blueprint, ...]:
        """The blueprint of each layer: its own values in `spec` and its own parts; one entry
        per layer, so for building only: counting and checks use `groups()`, whose cost does not
        grow with the layer count."""
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
        if not self.spec.layers:  # every layer is the model's: no per-layer tuple to make
            range(self.spec.num_layers)[i]  # IndexError as the tuple would raise it
            return self
        return self.layers[i]

    def groups(self) -> list[tuple[Sequence[int], Blueprint]]:
        """The distinct layers: `(indices, blueprint)`, in the order of their first layer.

        Layers that repeat are one group: a model without per-layer values is the one group
        `(range(num_layers), self)`, whatever its layer count (10**12 included); one with
        them has at most `MAX_LAYERED` layers, each resolved on its own."""
        if not self.spec.layers:
            return [(range(self.spec.num_layers), self)]
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


def _able(registry: Registry, kind: str, feature: str = "mask") -> list[str]:
    return [e.name for e in registry.entries(kind) if feature in e.component.features]
