"""Gemma (`GemmaForCausalLM`, model_type `gemma`): a Llama whose token embeddings are scaled by
`sqrt(hidden_size)` (rounded to the model's dtype: `embed_scale`), whose RMSNorms compute
`x · (1 + w)` (`norm=rmsnorm(zero_centered=true)`), with a GeGLU MLP in its tanh form (the
legacy `hidden_act: gelu` of the released configs means it too), heads 256 wide and tied
embeddings by default.

    config.json                      spec
    hidden_act / hidden_activation   ffn=geglu(approximate=tanh)
    hidden_size                      d_model, embed_scale=sqrt(d_model)
    the rest                         as Llama's (`lmcore.hf.llama`)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Derived, Dropout, Field, Fixed, Rope

DEFAULTS: Final = {
    "vocab_size": 256000,
    "hidden_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "intermediate_size": 24576,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
# transformers reads Gemma's `hidden_act: gelu` as the tanh approximation it was trained with.
ACTIVATIONS: Final = {**GATED, "gelu": GATED["gelu_pytorch_tanh"]}


def embed_scale(values: Mapping[str, Any]) -> float:
    """`hidden_size ** 0.5`, as transformers computes the normaliser."""
    scale: float = values["d_model"] ** 0.5
    return scale


GEMMA_SPEC: Final = {
    "block": "prenorm",
    "norm": "rmsnorm",
    "norm.zero_centered": True,
    "pos": "rope",
    "attn": "sdpa",
}

FAMILY: Final = Family(
    model_type="gemma",
    architecture="GemmaForCausalLM",
    spec=GEMMA_SPEC,
    rules=(
        *core(DEFAULTS),
        Choice(
            "hidden_act",
            ACTIVATIONS,
            "gelu_pytorch_tanh",
            aliases=("hidden_activation",),
            what="a gated MLP's activation",
        ),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Derived("embed_scale", embed_scale),
        Rope(),
        Fixed("use_bidirectional_attention", (None, False), "lmcore's attention is causal"),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        *mlp(),
    ),
)
