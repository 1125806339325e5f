"""Llama (`LlamaForCausalLM`, model_type `llama`): lmcore's default architecture under other
names. Pre-norm blocks of RMSNorm, causal grouped-query attention with rotary embeddings
(Llama 3.x's `llama3` and linear frequency scaling included), a gated MLP, a final RMSNorm and
an output matrix, tied or not. `attention_bias` puts biases on q, k, v and o (`qkv_bias`,
`out_bias`), `mlp_bias` on the MLP (`ffn=swiglu(bias=true)`); `hidden_act: gelu` is GeGLU.

    config.json                                 spec
    vocab_size, hidden_size, num_hidden_layers  vocab_size, d_model, num_layers
    num_attention_heads, num_key_value_heads    num_heads, num_kv_heads (null: num_heads)
    head_dim (null: hidden_size / heads)        head_dim
    intermediate_size, max_position_embeddings  d_ff, context_length
    tie_word_embeddings, rms_norm_eps           tie_embeddings, norm=rmsnorm(eps=...)
    rope_theta, rope_scaling / rope_parameters  pos=rope(theta=..., scaling=..., factor=...)
    hidden_act, mlp_bias                        ffn=swiglu | geglu, ffn=...(bias=...)
    attention_bias                              qkv_bias, out_bias
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Dropout, Field, Rope

DEFAULTS: Final = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 11008,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}

FAMILY: Final = Family(
    model_type="llama",
    architecture="LlamaForCausalLM",
    spec={"block": "prenorm", "norm": "rmsnorm", "pos": "rope", "attn": "sdpa"},
    rules=(
        *core(DEFAULTS),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Field("mlp_bias", "ffn.bias", bool, False),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Rope(),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        *mlp(),
    ),
)
