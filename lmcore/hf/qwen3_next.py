"""Qwen3-Next (`Qwen3NextForCausalLM`, model_type `qwen3_next`): gated DeltaNet layers with a
gated-attention layer every `full_attention_interval`-th (by default the fourth), each followed
by a mixture of SwiGLU experts with a shared expert behind a sigmoid gate. Every RMSNorm is
zero-centred, `x · (1 + w)` (`norm=rmsnorm(zero_centered=true)`, Gemma's), the per-head q/k
norms too; the attention rotates a quarter of each head (`partial_rotary_factor`) and
multiplies its output by `sigmoid(gate)`, the gate computed with the query: Hugging Face's
`q_proj` holds, head by head, the head's query rows then its gate rows, which are lmcore's
`q_proj` and `gate_proj` (`attn_gate=true`).

    config.json                                          spec
    layer_types / full_attention_interval                mixer=gated_deltanet, mixer[...]=attention
    linear_num_key_heads, linear_num_value_heads,        mixer=gated_deltanet(num_k_heads,
      linear_key_head_dim, linear_value_head_dim,          num_v_heads, head_k_dim, head_v_dim,
      linear_conv_kernel_dim, rms_norm_eps                 conv_size, eps)
    rms_norm_eps                                         norm, qk_norm = rmsnorm(zero_centered)
    partial_rotary_factor (absent: 0.25)                 pos=rope(fraction=...)
    (every attention layer)                              attn_gate=true
    num_experts, num_experts_per_tok, norm_topk_prob,    ffn=moe(...), as Qwen3-MoE's
      moe_intermediate_size, mlp_only_layers,
      decoder_sparse_step
    shared_expert_intermediate_size                      ffn=moe(shared=swiglu(d_ff=...),
                                                           shared_gate=sigmoid)
    the rest                                             as Qwen3-MoE's (`lmcore.hf.qwen3_moe`)

Tensors: `linear_attn.*` are the gated DeltaNet's own names (`layers.{i}.attn.*`),
`mlp.shared_expert.*` and `mlp.shared_expert_gate` the MoE's `shared.*` and `shared_gate`.
The multi-token-prediction head released checkpoints carry (`mtp.*`) is not part of the causal
LM transformers loads, and is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Draft, Dropout, Field, Fixed, Moe, Rope, SpecView, checked, spread
from lmcore.hf.values import json_text, too_many
from lmcore.hf.weights import COPY, ROTARY, Layout, PerHead, Weight, weight
from lmcore.spec import ComponentSpec

DEFAULTS: Final = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}
LINEAR, FULL = "linear_attention", "full_attention"
INTERVAL: Final = 4  # transformers' default full_attention_interval
# The gated DeltaNet's config fields, its arguments and transformers' defaults.
_DELTANET: Final = (
    ("linear_num_key_heads", "num_k_heads", 16),
    ("linear_num_value_heads", "num_v_heads", 32),
    ("linear_key_head_dim", "head_k_dim", 128),
    ("linear_value_head_dim", "head_v_dim", 128),
    ("linear_conv_kernel_dim", "conv_size", 4),
)
SHARED_DEFAULT: Final = 512  # shared_expert_intermediate_size


_TYPES: Final = (LINEAR, FULL)


def _types(n: int, interval: int) -> list[str]:
    """transformers' `layer_types` of `full_attention_interval`: every interval-th attends."""
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]


def _by_layer(flags: bool | list[bool], yes: Any, no: Any) -> Any:
    return (yes if flags else no) if isinstance(flags, bool) else [yes if f else no for f in flags]


@dataclass(frozen=True)
class Mixers:
    """Which layers are gated DeltaNet and which attention (`layer_types`, or without it every
    `full_attention_interval`-th layer attends, as transformers derives it), and the DeltaNet's
    sizes from the `linear_*` fields, its output norm's epsilon from `rms_norm_eps`. Written
    back as `layer_types` (and the base config's `full_attention_interval`, while it still
    says the same)."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("layer_types", "full_attention_interval", *(f for f, _, _ in _DELTANET))

    def read(self, d: Draft) -> None:
        p = d.problems
        args = {arg: checked(f, d.field(f, default), int, p) for f, arg, default in _DELTANET}
        eps = checked("rms_norm_eps", d.field("rms_norm_eps", 1e-6), float, p)
        interval = checked(
            "full_attention_interval", d.field("full_attention_interval", INTERVAL), int, p
        )
        n, types = d.num_layers, d.config.get("layer_types")
        if n is None or interval is None:
            return
        flags: range | list[bool] = range(interval - 1, n, interval)
        source = f"full_attention_interval={interval}"
        if types is not None:
            # the length first: a list of n entries is as long as the file says
            if (
                not isinstance(types, list)
                or len(types) != n
                or any(t not in _TYPES for t in types)
            ):
                p.append(
                    f"layer_types={json_text(types)}: lmcore reads a list of {n:,} "
                    f'"{LINEAR}" or "{FULL}"'
                )
                return
            if d.config.get("full_attention_interval") is not None and types != _types(n, interval):
                p.append(
                    f"layer_types and full_attention_interval={json_text(interval)} disagree "
                    "(transformers reads layer_types: give one)"
                )
                return
            source, flags = "layer_types", [t == FULL for t in types]
        full = spread(n, flags)
        if full is None:
            p.append(too_many(n, f"full attention ({source})"))
            return
        if None in args.values() or eps is None:
            return
        d.set("mixer", _by_layer(full, "attention", "gated_deltanet"), "layer_types")
        for arg, value in (*args.items(), ("eps", eps)):
            d.set(f"mixer.{arg}", _by_layer(full, None, value), "the linear attention")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        types = [FULL if m == "attention" else LINEAR for m in v.layers("mixer")]
        out["layer_types"] = types
        interval = v.base.get("full_attention_interval")
        if type(interval) is int and interval > 0 and types == _types(v.n, interval):
            out["full_attention_interval"] = interval
        dims = {"num_k_heads": v.spec.num_heads, "num_v_heads": v.spec.num_heads,
                "head_k_dim": v.spec.head_dim, "head_v_dim": v.spec.head_dim}  # fmt: skip
        for name, arg, default in _DELTANET:
            value = v.first(f"mixer.{arg}")
            if value is None:  # no DeltaNet layer: the fields are unused, kept
                out[name] = v.base.get(name, default)
            else:  # 0: the model's heads or head_dim
                out[name] = value or dims.get(arg, value)


@dataclass(frozen=True)
class SharedExpert:
    """The shared expert of every MoE layer, a SwiGLU `shared_expert_intermediate_size` wide
    behind `sigmoid(shared_expert_gate x)`: `ffn=moe(shared=swiglu(d_ff=...),
    shared_gate=sigmoid)`. Read after `Moe`, whose layers it joins."""

    name: str = "shared_expert_intermediate_size"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        width = checked(self.name, d.field(self.name, SHARED_DEFAULT), int, d.problems)
        ffn = d.values.get("ffn")
        if width is None or ffn is None:
            return
        sparse = [f == "moe" for f in ffn] if isinstance(ffn, list) else ffn == "moe"
        shared = ComponentSpec("swiglu", (("d_ff", width),))
        d.set("ffn.shared", _by_layer(sparse, shared, None), self.name)
        d.set("ffn.shared_gate", _by_layer(sparse, "sigmoid", None), self.name)

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        shared = v.first("ffn.shared")  # a Part; the read-back names any other expert or gate
        width = None if shared is None else shared.spec.kwargs.get("d_ff")
        if shared is not None and width is None:  # no width of its own: the experts'
            width = next(
                w for w, f in zip(v.layers("d_ff"), v.layers("ffn"), strict=True) if f == "moe"
            )
        out[self.name] = width if width is not None else v.base.get(self.name, SHARED_DEFAULT)


def _linear(ours: str, theirs: str, layout: Layout = COPY) -> tuple[Weight, ...]:
    """A linear layer's weight and bias (the bias row applies when the model has one)."""
    return tuple(weight(f"{ours}.{p}", f"{theirs}.{p}", layout) for p in ("weight", "bias"))


def _attention(at: str = "model.layers.{i}.self_attn") -> tuple[Weight, ...]:
    """The gated attention: q_proj holds each head's query rows then its gate rows (lmcore's
    q_proj, rotated, and gate_proj), k and v, o_proj, and the q/k norms."""
    ours = "layers.{i}.attn"
    gated = PerHead((True, False))
    return (
        *(
            weight((f"{ours}.q_proj.{p}", f"{ours}.gate_proj.{p}"), f"{at}.q_proj.{p}", gated)
            for p in ("weight", "bias")
        ),
        *_linear(f"{ours}.k_proj", f"{at}.k_proj", ROTARY),
        *_linear(f"{ours}.v_proj", f"{at}.v_proj"),
        *_linear(f"{ours}.output_proj", f"{at}.o_proj"),
        weight(f"{ours}.q_norm.weight", f"{at}.q_norm.weight", ROTARY),
        weight(f"{ours}.k_norm.weight", f"{at}.k_norm.weight", ROTARY),
    )


_LINEAR_ATTN: Final = ("in_proj_qkvz.weight", "in_proj_ba.weight", "conv1d.weight", "dt_bias",
                       "A_log", "norm.weight", "out_proj.weight")  # fmt: skip
AT: Final = "model.layers.{i}.mlp"
_SWIGLU: Final = (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))

FAMILY: Final = Family(
    model_type="qwen3_next",
    architecture="Qwen3NextForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "norm.zero_centered": True,
        "pos": "rope",
        "attn": "sdpa",
        "qk_norm": "rmsnorm",
        "qk_norm.zero_centered": True,
        "attn_gate": True,
    },
    rules=(
        *core(DEFAULTS, d_ff=False, qk_norm=True),
        Fixed(
            "hidden_act",
            ("silu", "swish"),
            "lmcore's experts and DeltaNet convolution here use silu",
        ),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Mixers(),
        Moe(
            experts=("num_experts",),
            experts_default=512,
            top_k_default=10,
            renormalize="norm_topk_prob",
            renormalize_default=True,
            d_ff="moe_intermediate_size",
            dense="mlp_only_layers",
            step="decoder_sparse_step",
        ),
        SharedExpert(),
        Rope(fraction=0.25, fraction_names=("partial_rotary_factor",)),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *_attention(),
        *(
            weight(f"layers.{{i}}.attn.{name}", f"model.layers.{{i}}.linear_attn.{name}", COPY)
            for name in _LINEAR_ATTN
        ),
        *mlp(),
        weight("layers.{i}.ffn.router.weight", f"{AT}.gate.weight"),
        *(
            weight(
                f"layers.{{i}}.ffn.experts.{{e}}.{ours}.weight", f"{AT}.experts.{{e}}.{hf}.weight"
            )
            for ours, hf in _SWIGLU
        ),
        *(
            weight(f"layers.{{i}}.ffn.shared.{ours}.weight", f"{AT}.shared_expert.{hf}.weight")
            for ours, hf in _SWIGLU
        ),
        weight("layers.{i}.ffn.shared_gate.weight", f"{AT}.shared_expert_gate.weight"),
    ),
    skip_prefixes=("mtp.",),
)
