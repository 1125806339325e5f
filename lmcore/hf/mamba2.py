"""Mamba-2 (`Mamba2ForCausalLM`, model_type `mamba2`): layers of Mamba-2 (SSD) alone, no
feed-forward network and no positions. Each layer is `x + mixer(norm(x))` (`block=prenorm,
ffn=none`: `ln1` and the mixer, no `ln2`), the mixer lmcore's `mamba2` under transformers'
`Mamba2Mixer` names; then a final RMSNorm and the head.

    config.json                               spec
    vocab_size, hidden_size, num_hidden_layers  vocab_size, d_model, num_layers
    num_heads, head_dim                       num_heads, head_dim (the SSM heads:
                                                num_heads · head_dim = expand · hidden_size)
    state_size, expand, n_groups              mixer=mamba2(d_state=..., expand=..., n_groups=...)
    conv_kernel, use_conv_bias, use_bias      mixer=mamba2(conv_size=..., conv_bias=..., bias=...)
    chunk_size                                mixer=mamba2(chunk_size=...) (how it computes)
    layer_norm_epsilon                        norm=rmsnorm(eps=...), mixer=mamba2(eps=...)
    tie_word_embeddings                       tie_embeddings
    max_position_embeddings (absent: 2048)    context_length (lmcore's; transformers' Mamba-2
                                                reads no such field and has no limit: add it
                                                to config.json for longer sequences)

`hidden_act` must be silu and `time_step_limit` (0, inf) (transformers clamps dt to it in the
chunked form only). `time_step_rank/min/max/floor` and `rescale_prenorm_residual` configure the
initialisation: kept. `residual_in_fp32` keeps transformers' residual stream in float32 whatever
the weights' dtype; lmcore's stream is in the model's dtype, the same in float32 (what the
conversion is exact to), so it is kept, and noted when true.

State-dict keys: `backbone.layers.{i}.norm` is `ln1`, `backbone.layers.{i}.mixer.*` is
`layers.{i}.attn.*`, `backbone.embeddings`, `backbone.norm_f` the embeddings and `ln_final`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import ends
from lmcore.hf.family import Family
from lmcore.hf.rules import Draft, Field, Fixed, SpecView, checked
from lmcore.hf.values import json_text
from lmcore.hf.weights import weight

# lmcore's context_length when the config gives none: the Mamba-2 checkpoints' training length
# (the layer has no limit; a config.json with max_position_embeddings gives another).
CONTEXT: Final = 2048
MIXER_TENSORS: Final = (
    "in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "dt_bias", "A_log", "D",
    "norm.weight", "out_proj.weight", "out_proj.bias",
)  # fmt: skip


def _number(value: Any) -> Any:
    """A float as transformers writes it into config.json (`{"__float__": "Infinity"}`)."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        try:
            return float(value["__float__"])
        except (TypeError, ValueError):
            return value
    return value


@dataclass(frozen=True)
class TimeStepLimit:
    """`time_step_limit`: the range transformers clamps dt to (in its chunked form only, so a
    range other than (0, inf) computes differently by prefill and decoding): (0, inf) only."""

    name: str = "time_step_limit"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        given = d.config.get(self.name)
        if given is None:
            return
        limits = [_number(v) for v in given] if isinstance(given, list | tuple) else None
        if limits != [0.0, math.inf]:
            d.problems.append(
                f"{self.name}={json_text(given)}: lmcore's mamba2 clamps dt to nothing, "
                "transformers' default (0.0, inf)"
            )

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        out[self.name] = v.base.get(self.name, [0.0, math.inf])


@dataclass(frozen=True)
class ResidualInFp32:
    """`residual_in_fp32`: transformers' residual stream in float32 whatever the weights'
    dtype. lmcore's is in the model's dtype: the same in float32; noted when true."""

    name: str = "residual_in_fp32"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        on = checked(self.name, d.field(self.name, True), bool, d.problems)
        if on:
            d.notes.append(
                f"{self.name}=true: transformers keeps the residual stream in float32 whatever "
                "the weights' dtype, lmcore in the model's dtype: the same in float32, rounded "
                "in 16-bit dtypes (kept in the metadata and written back)"
            )

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        out[self.name] = v.base.get(self.name, True)


@dataclass(frozen=True)
class Heads:
    """`num_heads · head_dim` must be the inner width `expand · hidden_size`, as transformers
    checks: its heads split that width, lmcore's are `expand · d_model / head_dim`."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ()

    def read(self, d: Draft) -> None:
        width, expand = d.values.get("d_model"), d.values.get("mixer.expand")
        heads, size = d.values.get("num_heads"), d.values.get("head_dim")
        if None in (width, expand, heads, size):
            return
        if heads * size != expand * width:
            d.problems.append(
                f"num_heads={heads} and head_dim={size} split {heads * size:,} channels, not "
                f"expand · hidden_size = {expand} · {width} = {expand * width:,} (transformers' "
                "Mamba2Config refuses it too)"
            )

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        return None


@dataclass(frozen=True)
class Context:
    """lmcore's `context_length` as `max_position_embeddings`, a field transformers' Mamba-2
    does not read (it has no limit): absent, 2048; written back only when it is not that."""

    name: str = "max_position_embeddings"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        value = checked(self.name, d.field(self.name, CONTEXT), int, d.problems)
        if value is not None:
            d.set("context_length", value, f"{self.name}={json_text(value)}")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        if v.spec.context_length != CONTEXT or self.name in v.base:
            out[self.name] = v.spec.context_length


DEFAULTS: Final = {
    "vocab_size": 32768,
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "num_heads": 128,
    "head_dim": 64,
}
AT: Final = "backbone.layers.{i}"
FAMILY: Final = Family(
    model_type="mamba2",
    architecture="Mamba2ForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "ffn": "none",
        "pos": "nope",
        "attn": "sdpa",
        "mixer": "mamba2",
    },
    rules=(
        Field("vocab_size", "vocab_size", int, DEFAULTS["vocab_size"]),
        Field("hidden_size", "d_model", int, DEFAULTS["hidden_size"]),
        Field("num_hidden_layers", "num_layers", int, DEFAULTS["num_hidden_layers"]),
        Field("num_heads", "num_heads", int, DEFAULTS["num_heads"]),
        Field("head_dim", "head_dim", int, DEFAULTS["head_dim"]),
        Context(),
        Field("tie_word_embeddings", "tie_embeddings", bool, False),
        Field("layer_norm_epsilon", ("norm.eps", "mixer.eps"), float, 1e-5),
        Field("state_size", "mixer.d_state", int, 128),
        Field("expand", "mixer.expand", int, 2),
        Field("n_groups", "mixer.n_groups", int, 8),
        Field("conv_kernel", "mixer.conv_size", int, 4),
        Field("chunk_size", "mixer.chunk_size", int, 256),
        Field("use_conv_bias", "mixer.conv_bias", bool, True),
        Field("use_bias", "mixer.bias", bool, False),
        Heads(),
        Fixed("hidden_act", ("silu", "swish"), "lmcore's mamba2 applies silu after the conv"),
        TimeStepLimit(),
        ResidualInFp32(),
    ),
    tensors=(
        *ends("backbone.embeddings.weight", "backbone.norm_f"),
        weight("layers.{i}.ln1.weight", f"{AT}.norm.weight"),
        *(weight(f"layers.{{i}}.attn.{t}", f"{AT}.mixer.{t}") for t in MIXER_TENSORS),
    ),
    embedding="backbone.embeddings.weight",
    prefix="backbone.",
    passive=frozenset(
        {
            "time_step_rank",
            "time_step_min",
            "time_step_max",
            "time_step_floor",
            "rescale_prenorm_residual",
        }
    ),
)
