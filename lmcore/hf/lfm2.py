"""LFM2 (`Lfm2ForCausalLM`, model_type `lfm2`): gated short-convolution layers between attention
layers (`layer_types` of "conv" and "full_attention", or `full_attn_idxs`:
`mixer=short_conv(conv_size=conv_L_cache, bias=conv_bias), mixer[layers]=attention`), pre-norm
blocks of RMSNorms (`operator_norm`, `ffn_norm`), attention with an RMSNorm on each head of q and
k (`q_layernorm`, `k_layernorm`) and no biases, a SwiGLU whose width transformers adjusts from
`intermediate_size`, a final norm `model.embedding_norm` and tied embeddings by default.

    config.json                                      spec
    layer_types / full_attn_idxs                     mixer=short_conv(...), mixer[layers]=attention
    conv_L_cache, conv_bias                          mixer=short_conv(conv_size=..., bias=...)
    intermediate_size (block_ff_dim),
      block_auto_adjust_ff_dim,
      block_ffn_dim_multiplier, block_multiple_of    d_ff, as transformers computes it
    norm_eps                                         norm=rmsnorm(eps=...), qk_norm=rmsnorm(eps=...)
    tie_word_embeddings (tie_embedding)              tie_embeddings
    the rest                                         as Llama's (`lmcore.hf.llama`)

A convolution layer's tensors (`conv.in_proj`, `conv.conv`, `conv.out_proj`) are short_conv's
(`attn.in_proj`, `attn.conv_weight` without the depthwise filter's middle axis,
`attn.out_proj`). Written back, `d_ff` is `intermediate_size` with
`block_auto_adjust_ff_dim: false`, unless the base config's fields compute the same width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from torch import Tensor

from lmcore.hf.common import core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import FULL, Draft, Field, Rope, Rule, SpecView, spread
from lmcore.hf.values import checked
from lmcore.hf.values import json_text as _json
from lmcore.hf.values import too_many as _too_many
from lmcore.hf.weights import COPY, ROTARY, Rotation, Shape, weight

DEFAULTS: Final = {
    "vocab_size": 65536,
    "hidden_size": 2560,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 128000,
    "tie_word_embeddings": True,
    "norm_eps": 1e-5,
}
CONV: Final = "conv"
WIDTH: Final = {
    "intermediate_size": 12288,
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 256,
}


def ff_width(size: int, adjust: bool, multiplier: float | None, multiple_of: int) -> int:
    """The SwiGLU's width as transformers' Lfm2MLP computes it from the config."""
    if not adjust:
        return size
    width = int(2 * size / 3)
    if multiplier is not None:
        width = int(multiplier * width)
        width = multiple_of * ((width + multiple_of - 1) // multiple_of)
    return width


@dataclass(frozen=True)
class Width:
    """`intermediate_size` (or `block_ff_dim`) and the three fields that adjust it to `d_ff`."""

    @property
    def fields(self) -> tuple[str, ...]:
        return (*WIDTH, "block_ff_dim")

    @staticmethod
    def _given(config: Mapping[str, Any], problems: list[str]) -> tuple[Any, ...] | None:
        names = ("block_ff_dim", "intermediate_size")  # transformers prefers block_ff_dim
        sizes = [(n, config[n]) for n in names if config.get(n) is not None]
        if len({_json(v) for _, v in sizes}) > 1:
            problems.append(" and ".join(f"{n}={_json(v)}" for n, v in sizes) + " disagree")
            return None
        name, size = sizes[0] if sizes else ("intermediate_size", WIDTH["intermediate_size"])
        size = checked(name, size, int, problems)
        adjust = config.get("block_auto_adjust_ff_dim", WIDTH["block_auto_adjust_ff_dim"])
        adjust = checked("block_auto_adjust_ff_dim", adjust, bool, problems)
        multiplier = config.get("block_ffn_dim_multiplier", WIDTH["block_ffn_dim_multiplier"])
        if (  # null: no multiplier, no rounding
            multiplier is not None
            and checked("block_ffn_dim_multiplier", multiplier, float, problems) is None
        ):
            return None
        multiple = config.get("block_multiple_of", WIDTH["block_multiple_of"])
        multiple = checked("block_multiple_of", multiple, int, problems)
        if None in (size, adjust, multiple):
            return None
        return size, adjust, multiplier, multiple

    def read(self, d: Draft) -> None:
        given = self._given(d.config, d.problems)
        if given is None:
            return
        width = ff_width(*given)
        if width <= 0:
            d.problems.append(
                f"intermediate_size={_json(given[0])} adjusted by block_auto_adjust_ff_dim gives "
                f"a feed-forward {width} wide"
            )
            return
        d.set("d_ff", width, "intermediate_size")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        d_ff = v.first("d_ff")
        base = {k: v.base[k] for k in (*WIDTH, "block_ff_dim") if k in v.base}
        given = self._given(base, []) if base else None
        if given is not None and ff_width(*given) == d_ff:
            out.update(base)  # the base config's own fields compute this width
            return
        out.update(
            {
                **{k: v.base.get(k, value) for k, value in WIDTH.items()},
                "intermediate_size": d_ff,
                "block_auto_adjust_ff_dim": False,
            }
        )


@dataclass(frozen=True)
class Mixers:
    """`layer_types` ("conv" or "full_attention"; given, it alone counts, as transformers 4 and
    5 read it; absent, `full_attn_idxs` names the attention layers, absent too, every layer) to
    `mixer=short_conv(conv_size=conv_L_cache, bias=conv_bias)` on the convolution layers and
    `attention` on the others."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("layer_types", "full_attn_idxs", "conv_L_cache", "conv_bias")

    def read(self, d: Draft) -> None:
        p, n = d.problems, d.num_layers
        size = checked("conv_L_cache", d.field("conv_L_cache", 3), int, p)
        bias = checked("conv_bias", d.field("conv_bias", False), bool, p)
        types, idxs = d.config.get("layer_types"), d.config.get("full_attn_idxs")
        listed = isinstance(idxs, list) and all(type(i) is int and i >= 0 for i in idxs)
        if types is None and idxs is not None and not listed:  # read only without layer_types
            p.append(f"full_attn_idxs={_json(idxs)} is not a list of layer indices")
            return
        if n is None or size is None or bias is None:
            return
        conv: bool | list[bool] | None
        if types is not None:
            if (
                not isinstance(types, list)
                or len(types) != n
                or not all(t in (CONV, FULL) for t in types)
            ):
                p.append(
                    f'layer_types={_json(types)}: lmcore reads a list of {n:,} "{CONV}" or "{FULL}"'
                )
                return
            conv = spread(n, [t == CONV for t in types])
        elif idxs is None:
            conv = False  # every layer attends
        else:
            conv = spread(n, range(n), but=idxs)
        if conv is None:
            p.append(_too_many(n, "convolutions"))
            return
        if isinstance(conv, bool):
            d.set("mixer", "short_conv" if conv else "attention", "layer_types")
            if conv:
                d.set("mixer.conv_size", size, "conv_L_cache")
                d.set("mixer.bias", bias, "conv_bias")
            return
        d.set("mixer", ["short_conv" if c else "attention" for c in conv], "layer_types")
        d.set("mixer.conv_size", [size if c else None for c in conv], "conv_L_cache")
        d.set("mixer.bias", [bias if c else None for c in conv], "conv_bias")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        mixers = v.layers("mixer")
        out["layer_types"] = [CONV if m == "short_conv" else FULL for m in mixers]
        out["full_attn_idxs"] = [i for i, m in enumerate(mixers) if m != "short_conv"]
        size, bias = v.first("mixer.conv_size"), v.first("mixer.bias")
        out["conv_L_cache"] = size if size is not None else v.base.get("conv_L_cache", 3)
        out["conv_bias"] = bias if bias is not None else v.base.get("conv_bias", False)


@dataclass(frozen=True)
class _Depthwise:
    """A depthwise Conv1d's weight, `(channels, 1, taps)`, as short_conv's `(channels, taps)`."""

    def hf_shape(self, shapes: Sequence[Shape]) -> Shape:
        return (shapes[0][0], 1, *shapes[0][1:])

    def split(self, t: Tensor, shapes: Sequence[Shape], rot: Rotation) -> list[Tensor]:
        return [t[:, 0]]

    def join(self, ts: Sequence[Tensor], rot: Rotation) -> Tensor:
        return ts[0][:, None]


def _rules() -> tuple[Rule, ...]:
    """Llama's sizes with LFM2's epsilon field, `tie_embedding` for `tie_word_embeddings` (as
    transformers reads it), and no `intermediate_size` (the width's own rule)."""
    tie = Field("tie_word_embeddings", "tie_embeddings", bool, True, aliases=("tie_embedding",))
    sizes = core(DEFAULTS, d_ff=False, eps="norm_eps", qk_norm=True)
    return tuple(tie if getattr(r, "name", None) == tie.name else r for r in sizes)


AT: Final = "model.layers.{i}"
OURS: Final = "layers.{i}.attn"
FAMILY: Final = Family(
    model_type="lfm2",
    architecture="Lfm2ForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "ffn": "swiglu",
        "pos": "rope",
        "attn": "sdpa",
        "qk_norm": "rmsnorm",
    },
    rules=(*_rules(), Width(), Mixers(), Rope(theta=1000000.0)),
    tensors=(
        *ends(final="model.embedding_norm"),
        *norms({"ln1": "operator_norm", "ln2": "ffn_norm"}),
        weight(f"{OURS}.q_proj.weight", f"{AT}.self_attn.q_proj.weight", ROTARY),
        weight(f"{OURS}.k_proj.weight", f"{AT}.self_attn.k_proj.weight", ROTARY),
        weight(f"{OURS}.v_proj.weight", f"{AT}.self_attn.v_proj.weight"),
        weight(f"{OURS}.output_proj.weight", f"{AT}.self_attn.out_proj.weight"),
        weight(f"{OURS}.q_norm.weight", f"{AT}.self_attn.q_layernorm.weight", ROTARY),
        weight(f"{OURS}.k_norm.weight", f"{AT}.self_attn.k_layernorm.weight", ROTARY),
        *(
            weight(f"{OURS}.{name}.{kind}", f"{AT}.conv.{name}.{kind}", COPY)
            for name in ("in_proj", "out_proj")
            for kind in ("weight", "bias")
        ),
        weight(f"{OURS}.conv_weight", f"{AT}.conv.conv.weight", _Depthwise()),
        weight(f"{OURS}.conv_bias", f"{AT}.conv.conv.bias"),
        *mlp(f"{AT}.feed_forward", names=("w1", "w3", "w2")),
    ),
)
