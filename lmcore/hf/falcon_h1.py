"""Falcon-H1 (`FalconH1ForCausalLM`, model_type `falcon_h1`): attention and Mamba-2 side by side
in each layer (`mixer=attention_mamba2`), a gated MLP after them, and µP multipliers throughout,
each a spec argument (none folded into a weight, so converting back gives the same weights).

    config.json                                spec
    the sizes, rms_norm_eps, rope, attention   as Llama's (`lmcore.hf.common.core`)
    hidden_act (silu)                          ffn=swiglu, and the conv's silu in Mamba-2
    key_multiplier                             query_scale = key_multiplier / sqrt(head_dim)
    embedding_multiplier, lm_head_multiplier   embed_scale, logit_scale
    mlp_multipliers [gate, down]               ffn=swiglu(w1_scale=..., w2_scale=...)
    attention_in/out_multiplier,
      ssm_in/out_multiplier                    mixer=attention_mamba2(attention_in=..., ...)
    ssm_multipliers [z, x, B, C, dt]           mixer=...(z_multiplier=..., ..., dt_multiplier=...)
    mamba_d_ssm (null: mamba_expand · hidden)  mixer=...(d_inner=..., expand=...)
    mamba_n_heads, mamba_d_head ("auto")       mixer=...(ssm_head_dim=...): heads = d_inner / it
    mamba_d_state, mamba_n_groups, mamba_d_conv,
      mamba_chunk_size, mamba_conv_bias        mixer=...(d_state, n_groups, conv_size, ...)
    mamba_proj_bias, projectors_bias           mixer=...(bias=..., out_bias=on|off): in_proj's
                                                 and out_proj's
    mamba_rms_norm, mamba_norm_before_gate     mixer=...(gate_norm=none|norm_first|gate_first)
    attention_bias, mlp_bias                   qkv_bias, out_bias, ffn=swiglu(bias=...)

`time_step_limit` must be (0, inf), as for Mamba-2 (`lmcore.hf.mamba2`); `num_logits_to_keep`
is a generation setting (kept).

State-dict keys: `model.layers.{i}.self_attn.*` are `layers.{i}.attn.attn.*` (q and k rows
permuted for the rotation), `model.layers.{i}.mamba.*` are `layers.{i}.attn.ssm.*`,
`input_layernorm` / `pre_ff_layernorm` are `ln1` / `ln2`, `feed_forward` the ffn; the mixer's
`mup_vector` is a buffer transformers computes from `ssm_multipliers`, never saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.mamba2 import TimeStepLimit
from lmcore.hf.rules import Draft, Dropout, Field, Fixed, Rope, SpecView, checked
from lmcore.hf.values import json_text
from lmcore.hf.weights import COPY, ROTARY, weight
from lmcore.spec import default_query_scale

SSM_PARTS: Final = ("z", "x", "b", "c", "dt")


@dataclass(frozen=True)
class Multipliers:
    """A list field of `len(paths)` numbers (`mlp_multipliers`, `ssm_multipliers`), each to its
    spec path; absent or null, all ones."""

    name: str
    paths: tuple[str, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        given = d.field(self.name, [1.0] * len(self.paths))
        n = len(self.paths)
        if not isinstance(given, list | tuple) or len(given) != n:
            d.problems.append(f"{self.name}={json_text(given)} is not a list of {n} numbers")
            return
        for i, (path, value) in enumerate(zip(self.paths, given, strict=True)):
            got = checked(f"{self.name}[{i}]", value, float, d.problems)
            if got is not None:
                d.set(path, got, f"{self.name}={json_text(given)}")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        values = [v.first(p) for p in self.paths]
        if None not in values:
            out[self.name] = v.keep(self.name, values, lambda b: [float(x) for x in b])


def _key_multiplier(scale: float, head_dim: int) -> float:
    """The key_multiplier whose product with 1 / sqrt(head_dim) is `scale` exactly (the
    nearest float to their quotient, or a neighbour a few steps away)."""
    base = default_query_scale(head_dim)
    guess = scale / base
    for candidate in (guess, *(math.nextafter(guess, d) for d in (math.inf, -math.inf))):
        if candidate * base == scale:
            return candidate
    return guess  # what differs is named by the read-back


@dataclass(frozen=True)
class KeyMultiplier:
    """`key_multiplier` scales the keys: q·(m k) / sqrt(head_dim) is lmcore's query scale
    m / sqrt(head_dim), the same scores (and the cached keys stay unscaled)."""

    name: str = "key_multiplier"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        m = checked(self.name, d.field(self.name, 1.0), float, d.problems)
        head_dim = d.values.get("head_dim")
        if m is None or not isinstance(head_dim, int):
            return
        scale = default_query_scale(head_dim)
        d.set("query_scale", scale if m == 1.0 else m * scale, f"{self.name}={json_text(m)}")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        head_dim = v.spec.head_dim
        m = _key_multiplier(v.first("query_scale"), head_dim)
        out[self.name] = v.keep(self.name, m, lambda b: float(b))


@dataclass(frozen=True)
class InnerWidth:
    """`mamba_d_ssm` (null: `mamba_expand · hidden_size`), `mamba_n_heads` and `mamba_d_head`
    ("auto": the width over the heads) to the mixer's `d_inner`, `expand`, `ssm_head_dim`;
    the heads must split the width, as transformers checks."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("mamba_d_ssm", "mamba_expand", "mamba_n_heads", "mamba_d_head")

    def read(self, d: Draft) -> None:
        p = d.problems
        expand = checked("mamba_expand", d.field("mamba_expand", 2), int, p)
        d_ssm = d.config["mamba_d_ssm"] if "mamba_d_ssm" in d.config else 1024  # null: expand
        inner_given = None if d_ssm is None else checked("mamba_d_ssm", d_ssm, int, p)
        heads = checked("mamba_n_heads", d.field("mamba_n_heads", 128), int, p)
        width = d.values.get("d_model")
        if None in (expand, heads, width) or (d_ssm is not None and inner_given is None):
            return
        inner = inner_given if inner_given is not None else expand * width
        head = d.field("mamba_d_head", "auto")
        if head == "auto":
            head = inner // heads
        head = checked("mamba_d_head", head, int, p)
        if head is None:
            return
        if heads * head != inner:
            p.append(
                f"mamba_n_heads={heads} heads of mamba_d_head={head} are {heads * head:,} "
                f"channels, not the inner width {inner:,} (mamba_d_ssm, or mamba_expand · "
                "hidden_size; transformers' FalconH1Config refuses it too)"
            )
            return
        d.set("mixer.expand", expand, "mamba_expand")
        d.set("mixer.d_inner", inner_given or 0, "mamba_d_ssm")
        d.set("mixer.ssm_head_dim", head, "mamba_d_head")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        expand, d_inner = v.first("mixer.expand"), v.first("mixer.d_inner")
        head = v.first("mixer.ssm_head_dim") or v.spec.head_dim
        if expand is None:
            return  # not Mamba-2: the read-back names the mixer
        inner = d_inner or expand * v.spec.d_model
        out["mamba_expand"] = expand
        out["mamba_d_ssm"] = d_inner or None
        out["mamba_n_heads"] = inner // head
        out["mamba_d_head"] = head


@dataclass(frozen=True)
class ProjectionBiases:
    """`mamba_proj_bias` (in_proj's) and `projectors_bias` (out_proj's) to the mixer's `bias`
    and `out_bias`."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("mamba_proj_bias", "projectors_bias")

    def read(self, d: Draft) -> None:
        p = d.problems
        into = checked("mamba_proj_bias", d.field("mamba_proj_bias", False), bool, p)
        out = checked("projectors_bias", d.field("projectors_bias", False), bool, p)
        if into is None or out is None:
            return
        d.set("mixer.bias", into, "mamba_proj_bias")
        d.set("mixer.out_bias", "same" if out == into else "on" if out else "off", "projectors_bias")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        into, outs = v.first("mixer.bias"), v.first("mixer.out_bias")
        if into is None:
            return
        out["mamba_proj_bias"] = into
        out["projectors_bias"] = into if outs == "same" else outs == "on"


@dataclass(frozen=True)
class OutputNorm:
    """`mamba_rms_norm` (false: y · silu(z), no norm) and `mamba_norm_before_gate` to the
    mixer's `gate_norm`."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("mamba_rms_norm", "mamba_norm_before_gate")

    def read(self, d: Draft) -> None:
        p = d.problems
        on = checked("mamba_rms_norm", d.field("mamba_rms_norm", False), bool, p)
        first = checked(
            "mamba_norm_before_gate", d.field("mamba_norm_before_gate", True), bool, p
        )
        if on is None or first is None:
            return
        choice = "none" if not on else "norm_first" if first else "gate_first"
        d.set("mixer.gate_norm", choice, "mamba_rms_norm")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        choice = v.first("mixer.gate_norm")
        if choice is None:
            return
        out["mamba_rms_norm"] = choice != "none"
        kept = v.base.get("mamba_norm_before_gate", True)
        out["mamba_norm_before_gate"] = kept if choice == "none" else choice == "norm_first"


DEFAULTS: Final = {
    "vocab_size": 128000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
AT: Final = "model.layers.{i}"
ATTN: Final = "layers.{i}.attn.attn"
MAMBA_TENSORS: Final = (
    "in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D",
    "norm.weight", "out_proj.weight", "out_proj.bias",
)  # fmt: skip
FAMILY: Final = Family(
    model_type="falcon_h1",
    architecture="FalconH1ForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "ffn": "swiglu",
        "pos": "rope",
        "attn": "sdpa",
        "mixer": "attention_mamba2",
    },
    rules=(
        *core(DEFAULTS),
        Field("rms_norm_eps", "mixer.eps", float, DEFAULTS["rms_norm_eps"]),
        Fixed("hidden_act", ("silu", "swish"), "lmcore's Falcon-H1 MLP is SwiGLU and its conv "
              "applies silu"),  # fmt: skip
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Field("mlp_bias", "ffn.bias", bool, False),
        KeyMultiplier(),
        Field("embedding_multiplier", "embed_scale", float, 1.0),
        Field("lm_head_multiplier", "logit_scale", float, 1.0),
        Multipliers("mlp_multipliers", ("ffn.w1_scale", "ffn.w2_scale")),
        Field("attention_in_multiplier", "mixer.attention_in", float, 1.0),
        Field("attention_out_multiplier", "mixer.attention_out", float, 1.0),
        Field("ssm_in_multiplier", "mixer.ssm_in", float, 1.0),
        Field("ssm_out_multiplier", "mixer.ssm_out", float, 1.0),
        Multipliers("ssm_multipliers", tuple(f"mixer.{p}_multiplier" for p in SSM_PARTS)),
        InnerWidth(),
        Field("mamba_d_state", "mixer.d_state", int, 256),
        Field("mamba_n_groups", "mixer.n_groups", int, 1),
        Field("mamba_d_conv", "mixer.conv_size", int, 4),
        Field("mamba_chunk_size", "mixer.chunk_size", int, 256),
        Field("mamba_conv_bias", "mixer.conv_bias", bool, True),
        ProjectionBiases(),
        OutputNorm(),
        TimeStepLimit(),
        Rope(),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(final="model.final_layernorm"),
        *norms({"ln1": "input_layernorm", "ln2": "pre_ff_layernorm"}),
        *(
            weight(f"{ATTN}.{ours}.{p}", f"{AT}.self_attn.{theirs}.{p}", layout)
            for ours, theirs, layout in (
                ("q_proj", "q_proj", ROTARY), ("k_proj", "k_proj", ROTARY),
                ("v_proj", "v_proj", COPY), ("output_proj", "o_proj", COPY),
            )  # fmt: skip
            for p in ("weight", "bias")
        ),
        *(weight(f"layers.{{i}}.attn.ssm.{t}", f"{AT}.mamba.{t}") for t in MAMBA_TENSORS),
        *mlp(f"{AT}.feed_forward"),
    ),
    passive=frozenset({"num_logits_to_keep"}),
)
