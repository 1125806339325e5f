"""The checks of a resolved model's shape: heads that divide the width, each distinct layer
against its components' `validate` and `norms` declarations, and the attention kernel against
the features the model asks of it (an attention bias, a sliding window, capped scores,
attention sinks)."""

from __future__ import annotations

from collections.abc import Sequence

from lmcore.blueprint.origins import Origins
from lmcore.blueprint.resolved import SLOT_KINDS, Blueprint
from lmcore.errors import PluginError, one_of
from lmcore.spec import SLOTS


def divisors_near(n: int, target: int, count: int = 4) -> list[int]:
    """Up to `count` divisors of `n` closest to `target`, ascending. Looks only at 1, `n`, the
    powers of two and a window around `target` of at most 4,097 numbers, so the work never grows
    with `n` (a spec's integers reach 2**63)."""
    half = min(max(256, target), 2048)
    window = range(max(1, target - half), min(n, target + half) + 1)
    powers = (2**k for k in range(min(n.bit_length(), 64)))
    found = {d for d in (1, n, *window, *powers) if 1 <= d <= n and n % d == 0}
    return sorted(sorted(found, key=lambda d: (abs(d - target), d))[:count])


def check_shape(origins: Origins, bp: Blueprint) -> None:
    """Raise a `SpecError` at the value to blame when the model `bp` cannot be built."""
    spec = bp.spec
    d_model, heads = spec.d_model, spec.num_heads
    if "head_dim" not in origins.values and d_model % heads:
        raise origins.at_slot(
            "num_heads" if "num_heads" in origins.values else "d_model",
            f"d_model={d_model} is not divisible by num_heads={heads}; "
            f"num_heads that divide it: {', '.join(map(str, divisors_near(d_model, heads)))}"
            f", or give head_dim=... (the width of each head)",
        )
    absolute = [
        p.name for _, p in bp.used() if p.kind == "pos" and "absolute" in p.component.features
    ]
    if spec.varies("pos") and absolute:
        raise origins.at_slot(
            "pos",
            f"pos {absolute[0]!r} adds to the token embeddings, once for every layer, so it "
            "cannot differ by layer; give it to the whole model (pos=...) with no pos[...]",
        )
    for layers, lbp in bp.groups():
        _check_components(origins, lbp, layers)
        _check_norms(origins, lbp, layers)
        _check_kernel(origins, lbp, layers)


def _check_components(origins: Origins, bp: Blueprint, layers: Sequence[int]) -> None:
    """Each component's `validate` for the layers `bp` stands for."""
    spec = bp.spec
    for slot in bp.parts:
        comp = bp.component(slot)
        widths = [bp.kwargs(slot)]
        if slot == "qk_norm" and spec.qk_norm_scope == "full":
            widths.append({**widths[0], "d_model": spec.num_kv_heads * spec.head_dim})
        for kwargs in widths:
            try:
                # The plugin protocol: `validate` raises ValueError with a sentence.
                bp.entries[slot].invoke("validate", kwargs, allow=(ValueError,))
            except PluginError as e:
                raise origins.at_slot(slot, str(e), layers) from e
            except ValueError as e:
                # Blame what the user wrote: the slot (for these layers), else the
                # dimensions it is built for.
                dims = spec.dims(SLOT_KINDS[slot]) if slot in SLOTS else {}
                culprit = next(
                    (k for k in (slot, "num_heads", "d_model", *dims) if origins.by_user(k)), slot
                )
                if (slot, layers[0]) in origins.blame:
                    culprit = slot
                raise origins.at_slot(
                    culprit, f"{SLOT_KINDS[slot]} {comp.name!r}: {e}", layers
                ) from None


def _check_norms(origins: Origins, bp: Blueprint, layers: Sequence[int]) -> None:
    """The block's `norms` declaration, and a `qk_norm_scope` with no qk_norm to apply to."""
    try:
        names = bp.norm_names()
    except PluginError as e:
        raise origins.at_slot("block", str(e), layers) from e
    block = bp.parts["block"]
    bad = [
        x for x in names if not isinstance(x, str) or not x.isidentifier() or x in ("attn", "ffn")
    ]
    if bad or len(set(names)) != len(names):
        raise origins.at_slot(
            "block",
            f"block {block.name!r} from {block.provenance}: its norms declaration gives "
            f"{list(names)!r}; it must name distinct attributes (identifiers other than attn "
            "and ffn), one per norm the block builds",
            layers,
        )
    spec = bp.spec
    if spec.qk_norm is None and spec.qk_norm_scope != "head":
        raise origins.at_slot(
            "qk_norm_scope",
            "qk_norm_scope=full applies to a qk_norm, and this model has none; add "
            "qk_norm=rmsnorm (or another norm) or drop qk_norm_scope",
            layers,
        )


def _check_kernel(origins: Origins, bp: Blueprint, layers: Sequence[int]) -> None:
    """The attention kernel declares each feature the model asks of it."""
    spec = bp.spec
    pos, attn = bp.component("pos"), bp.component("attn")
    if "bias" in pos.features and "bias" not in attn.features:
        able = [e.name for e in bp.registry.entries("attn") if "bias" in e.component.features]
        raise origins.at_slot(
            "attn",
            f"attn {attn.name!r} cannot take the additive attention bias that pos "
            f"{pos.name!r} produces; kernels that can: {one_of(able)}",
            layers,
        )
    for key, feature, what in (
        ("window", "window", f"a sliding window (window={spec.window})"),
        ("attn_softcap", "softcap", f"capped scores (attn_softcap={spec.attn_softcap!r})"),
        ("attn_sinks", "sinks", "attention sinks (attn_sinks=true)"),
    ):
        if getattr(spec, key) and feature not in attn.features:
            able = [e.name for e in bp.registry.entries("attn") if feature in e.component.features]
            raise origins.at_slot(
                key if (key in origins.values or (key, layers[0]) in origins.blame) else "attn",
                f"attn {attn.name!r} cannot compute {what}: it does not declare the "
                f"{feature!r} feature; kernels that can: {one_of(able)}",
                layers,
            )
