"""Gemma 3 (`Gemma3ForCausalLM`, model_type `gemma3_text`): Gemma 2's sandwich norms and
`query_pre_attn_scalar`, with a (1 + w) RMSNorm on each head of q and k before the rotation
(`qk_norm=rmsnorm(zero_centered=true)`), no soft-capping by default, and local (sliding-window)
and global layers that rotate with their own bases: five local layers to one global by default
(`sliding_window_pattern: 6`, or `layer_types`), the local ones with `rope_local_base_freq`
(10,000), the global ones with `rope_theta` (1,000,000) and `rope_scaling` (linear, as the 4B+
models scale their context), in transformers 5's `rope_parameters` keyed by layer type.

    config.json                          spec
    layer_types / sliding_window_pattern which layers are local: window[layers]=sliding_window
    rope_local_base_freq                 pos[local]=rope(theta=...)
    rope_theta, rope_scaling             pos[global]=rope(theta=..., scaling=linear, factor=...)
    rope_parameters.sliding_attention    pos[local]=rope(...), transformers 5's spelling
    rope_parameters.full_attention       pos[global]=rope(...)
    rms_norm_eps                         norm=rmsnorm(eps=...), qk_norm=rmsnorm(eps=...)
    hidden_activation                    ffn=geglu(approximate=...), as transformers' ACT2FN
    the rest                             as Gemma 2's (`lmcore.hf.gemma2`)

Written back in transformers 4's fields (rope_theta, rope_local_base_freq, rope_scaling), which
4 and 5 read, unless the local layers are scaled too, which only transformers 5's
`rope_parameters` says. State-dict keys: Gemma 2's, with self_attn.q_norm / k_norm as
`attn.q_norm` / `attn.k_norm` (rows permuted with q and k).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.gemma import GEMMA_SPEC, embed_scale
from lmcore.hf.rules import (
    FULL,
    SLIDING,
    Choice,
    Derived,
    Draft,
    Dropout,
    Field,
    Fixed,
    SpecView,
    Window,
    checked,
    spread,
)
from lmcore.hf.values import json_text as _json
from lmcore.hf.values import too_many
from lmcore.spec import MAX_LAYERED

__all__ = ["DEFAULTS", "FAMILY", "LayerRope", "Pattern", "pattern_layers"]

DEFAULTS: Final = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "intermediate_size": 9216,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
PATTERN: Final = 6  # transformers' default: every sixth layer is global
# transformers' default bases, by layer type (Gemma3TextConfig.default_theta).
THETAS: Final = {FULL: 1_000_000.0, SLIDING: 10_000.0}
_TYPES: Final = (FULL, SLIDING)
# The rotary scalings a layer type's parameters may name, and the arguments each reads.
_SCALINGS: Final[Mapping[str, tuple[str, ...]]] = {"default": (), "linear": ("factor",)}


def _pattern_flags(d: Draft, n: int, problems: list[str]) -> range | list[bool]:
    """The layers `sliding_window_pattern` makes local (transformers: layer i is global when
    `(i + 1) % pattern == 0`), without a step per layer when all or none are."""
    p = checked("sliding_window_pattern", d.field("sliding_window_pattern", PATTERN), int, problems)
    if p is None or p > n:
        return range(n)
    if p == 1:
        return range(0)
    if n > MAX_LAYERED:
        problems.append(too_many(n, f"sliding_window_pattern={p}: a sliding window"))
        return range(n)  # refused above; the window rule needs some layers
    return [(i + 1) % p != 0 for i in range(n)]


def pattern_layers(d: Draft, n: int) -> range | Sequence[bool]:
    """The local layers of a config without `layer_types` (the window rule's default)."""
    return _pattern_flags(d, n, d.problems)


def _local(d: Draft) -> bool | list[bool] | None:
    """Which layers are local (True) or global, as one flag when all or none are; None when
    `layer_types` is refused (the window rule names it) or the layers are not known."""
    n = d.num_layers
    if n is None:
        return None
    types = d.config.get("layer_types")
    if types is None:
        return spread(n, _pattern_flags(d, n, []))  # its problems are the window rule's
    if not isinstance(types, list) or len(types) != n or not all(t in _TYPES for t in types):
        return None
    return spread(n, [t == SLIDING for t in types])


def _merge(
    into: dict[str, Any], origin: dict[str, str], given: Any, name: str, problems: list[str]
) -> bool:
    """Rotary parameters `given` (a dict, field `name`) added to `into`; False if refused."""
    if not isinstance(given, dict):
        problems.append(f"{name}={_json(given)} is not an object")
        return False
    if "type" in given and given.get("rope_type", given["type"]) != given["type"]:
        problems.append(f"{name} gives type={_json(given['type'])} and rope_type: they disagree")
        return False
    if "type" in given and "rope_type" not in given:
        # transformers 4 reads "type" here, 5 keeps the layer type's own "rope_type" beside it
        problems.append(
            f"{name}.type={_json(given['type'])}: transformers 5's Gemma 3 reads rope_type "
            f'only (and may compute no scaling); write "rope_type": {_json(given["type"])}'
        )
        return False
    for key, value in given.items():
        if key == "type":
            continue
        if key in into and into[key] != value:
            problems.append(
                f"{origin[key]}={_json(into[key])} and {name}.{key}={_json(value)} disagree"
            )
            return False
        into[key] = value
        origin[key] = f"{name}.{key}"
    return True


def _by_type(config: Mapping[str, Any], problems: list[str]) -> dict[str, dict[str, Any]] | None:
    """Each layer type's rope arguments (`theta`, `scaling`, `factor`; None: not given) as
    transformers 5's Gemma 3 reads them: `rope_parameters` by layer type, `rope_scaling` on the
    global layers, `rope_theta` and `rope_local_base_freq` where those give no base."""
    params: dict[str, dict[str, Any]] = {FULL: {}, SLIDING: {}}
    origin: dict[str, dict[str, str]] = {FULL: {}, SLIDING: {}}
    nested = config.get("rope_parameters")
    if nested is not None:
        if not isinstance(nested, dict) or not all(
            k in _TYPES and (v is None or isinstance(v, dict)) for k, v in nested.items()
        ):
            problems.append(
                f"rope_parameters={_json(nested)}: Gemma 3 reads rotary parameters by layer "
                f'type, {{"{FULL}": {{...}}, "{SLIDING}": {{...}}}} (transformers ignores any '
                "other key)"
            )
            return None
        for kind, given in nested.items():
            name = f"rope_parameters.{kind}"
            if given is not None and not _merge(params[kind], origin[kind], given, name, problems):
                return None
    scaling = config.get("rope_scaling")  # transformers 4: the global layers' scaling
    if scaling is not None and not _merge(
        params[FULL], origin[FULL], scaling, "rope_scaling", problems
    ):
        return None
    out: dict[str, dict[str, Any]] = {}
    for kind, top in ((FULL, "rope_theta"), (SLIDING, "rope_local_base_freq")):
        p, where = params[kind], origin[kind]
        if "rope_theta" in p and config.get(top) is not None and p["rope_theta"] != config[top]:
            problems.append(
                f"{top}={_json(config[top])} and {where['rope_theta']}="
                f"{_json(p['rope_theta'])} disagree"
            )
            return None
        theta_name = where.get("rope_theta", top)
        theta = p.pop("rope_theta", config.get(top))
        theta = checked(theta_name, THETAS[kind] if theta is None else theta, float, problems)
        rope_type = p.pop("rope_type", "default")
        if rope_type not in _SCALINGS:
            problems.append(
                f"{where.get('rope_type', 'rope_type')}={_json(rope_type)}: lmcore's rope on "
                'Gemma 3\'s layers scales frequencies by none ("default") or "linear"'
            )
            return None
        args: dict[str, Any] = {"theta": theta, "scaling": None, "factor": None}
        if rope_type != "default":
            args["scaling"] = rope_type
            for key in _SCALINGS[rope_type]:
                if p.get(key) is None:
                    problems.append(f"{kind}'s rope {rope_type} scaling without {key}")
                    return None
                args[key] = checked(where[key], p.pop(key), float, problems)
        if p:
            extra = ", ".join(f"{where[k]}={_json(v)}" for k, v in p.items())
            problems.append(
                f"rope parameters {extra}: lmcore's rope with {_json(rope_type)} scaling reads "
                "none of them"
            )
            return None
        if None in (args["theta"], *(args[k] for k in _SCALINGS[rope_type])):
            return None  # named by `checked`
        out[kind] = args
    return out


class LayerRope:
    """Gemma 3's rotary embeddings: one rope per layer type, the local layers' and the global
    layers' (`_by_type`), given to each layer as the window rule makes it local or global."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("rope_theta", "rope_local_base_freq", "rope_scaling", "rope_parameters")

    def read(self, d: Draft) -> None:
        by_type = _by_type(d.config, d.problems)
        local = _local(d)
        if by_type is None or local is None:
            return
        for arg in ("theta", "scaling", "factor"):
            on, off = by_type[SLIDING][arg], by_type[FULL][arg]
            if isinstance(local, bool):
                if (on if local else off) is not None:
                    d.set(f"pos.{arg}", on if local else off, "the rotary parameters")
            elif on is not None or off is not None:
                d.set(f"pos.{arg}", [on if s else off for s in local], "the rotary parameters")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        if any(p != "rope" for p in v.layers("pos")):
            return  # the read-back names it
        windows = v.layers("window")
        # a layer type no layer has: as the base config gives it, else transformers' default
        kept = _by_type(v.base, []) or {
            kind: {"theta": THETAS[kind], "scaling": None, "factor": None} for kind in _TYPES
        }
        args: dict[str, dict[str, Any]] = {}
        for kind in _TYPES:
            first = next((i for i, w in enumerate(windows) if bool(w) == (kind == SLIDING)), None)
            if first is None:
                args[kind] = kept[kind]
                continue
            scaling = v.at("pos.scaling", first)
            scaled = scaling not in (None, "none")
            args[kind] = {
                "theta": v.at("pos.theta", first),
                "scaling": scaling if scaled else None,
                "factor": v.at("pos.factor", first) if scaled else None,
            }
        if args[SLIDING]["scaling"] is None:  # transformers 4's fields: 4 and 5 read them
            out["rope_theta"] = v.keep("rope_theta", args[FULL]["theta"])
            out["rope_local_base_freq"] = v.keep("rope_local_base_freq", args[SLIDING]["theta"])
            out["rope_scaling"] = _rope_dict(args[FULL], theta=False)
            return
        out["rope_parameters"] = {kind: _rope_dict(args[kind], theta=True) for kind in _TYPES}


def _rope_dict(args: Mapping[str, Any], *, theta: bool) -> dict[str, Any] | None:
    """A layer type's rope dict (None: an unscaled `rope_scaling`)."""
    rope: dict[str, Any] = {"rope_type": args["scaling"] or "default"}
    if theta:
        rope["rope_theta"] = args["theta"]
    elif args["scaling"] is None:
        return None
    if args["scaling"] is not None:
        rope["factor"] = args["factor"]
    return rope


class Pattern:
    """`sliding_window_pattern`: read where a config has no `layer_types` (the window rule's
    `pattern_layers`); `layer_types` is always written, so the pattern is the base's, kept."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("sliding_window_pattern",)

    def read(self, d: Draft) -> None:
        return None

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        if "sliding_window_pattern" in v.base:
            out["sliding_window_pattern"] = v.base["sliding_window_pattern"]


def _softcap(value: float) -> Any:
    return value or None  # 0 (none) is written as null


def _scalar(scale: float) -> Any:
    return round(scale**-2) if round(scale**-2) ** -0.5 == scale else scale**-2


FAMILY: Final = Family(
    model_type="gemma3_text",
    architecture="Gemma3ForCausalLM",
    spec={
        **GEMMA_SPEC,
        "block": "sandwich",
        "qk_norm": "rmsnorm",
        "qk_norm.zero_centered": True,
    },
    rules=(
        *core(DEFAULTS, qk_norm=True),
        Choice("hidden_activation", GATED, "gelu_pytorch_tanh", what="a gated MLP's activation"),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Derived("embed_scale", embed_scale),
        Field(
            "query_pre_attn_scalar",
            "query_scale",
            float,
            256,
            reads=lambda s: s**-0.5,
            writes=_scalar,
        ),
        Field(
            "attn_logit_softcapping",
            "attn_softcap",
            float,
            0.0,
            zero=True,
            null=0.0,
            writes=_softcap,
        ),
        Field(
            "final_logit_softcapping",
            "logit_softcap",
            float,
            0.0,
            zero=True,
            null=0.0,
            writes=_softcap,
        ),
        Window(default=4096, layer_types=True, default_types=pattern_layers),
        Pattern(),
        LayerRope(),
        Fixed("use_bidirectional_attention", (None, False), "lmcore's attention is causal"),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms(
            {
                "ln1": "input_layernorm",
                "ln1_out": "post_attention_layernorm",
                "ln2": "pre_feedforward_layernorm",
                "ln2_out": "post_feedforward_layernorm",
            }
        ),
        *attention(),
        *mlp(),
    ),
    # `_sliding_window_pattern`: what transformers 5 saves of the pattern and never reads back
    passive=frozenset({"cache_implementation", "_sliding_window_pattern"}),
)
