"""Gemma 2 (`Gemma2ForCausalLM`, model_type `gemma2`): Gemma with norms before and after each
sub-layer (`block=sandwich`), q·k scaled by `query_pre_attn_scalar ** -0.5` (`query_scale`),
soft-capped attention scores and logits (`attn_softcap`, `logit_softcap`; null: none) and a
sliding window on the layers `layer_types` names (by default the even ones: `window[0::2]`).

    config.json                   spec
    query_pre_attn_scalar         query_scale = query_pre_attn_scalar ** -0.5
    attn_logit_softcapping        attn_softcap (null: 0)
    final_logit_softcapping       logit_softcap (null: 0)
    sliding_window, layer_types   window[layers]=...
    the rest                      as Gemma's (`lmcore.hf.gemma`)

State-dict keys: input_layernorm, post_attention_layernorm, pre_feedforward_layernorm and
post_feedforward_layernorm are `ln1`, `ln1_out`, `ln2` and `ln2_out`.
"""

from __future__ import annotations

from typing import Any, Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.gemma import GEMMA_SPEC, embed_scale
from lmcore.hf.rules import Choice, Derived, Draft, Dropout, Field, Fixed, Rope, Window

DEFAULTS: Final = {
    "vocab_size": 256000,
    "hidden_size": 2304,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}


def even_layers(d: Draft, n: int) -> range:
    """transformers' default `layer_types`: layers 0, 2, 4, ... slide."""
    return range(0, n, 2)


def _softcap(value: float) -> Any:
    return value or None  # 0 (none) is written as null


def _scalar(scale: float) -> Any:
    return round(scale**-2) if round(scale**-2) ** -0.5 == scale else scale**-2


FAMILY: Final = Family(
    model_type="gemma2",
    architecture="Gemma2ForCausalLM",
    spec={**GEMMA_SPEC, "block": "sandwich"},
    rules=(
        *core(DEFAULTS),
        # transformers' Gemma 2 takes hidden_activation as ACT2FN does ("gelu" is exact), and
        # never reads hidden_act, which released configs also hold: kept, passive
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
            50.0,
            zero=True,
            null=0.0,
            writes=_softcap,
        ),
        Field(
            "final_logit_softcapping",
            "logit_softcap",
            float,
            30.0,
            zero=True,
            null=0.0,
            writes=_softcap,
        ),
        Rope(),
        Window(default=4096, layer_types=True, default_types=even_layers),
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
    passive=frozenset({"cache_implementation", "hidden_act"}),
)
