"""Qwen 3 (`Qwen3ForCausalLM`, model_type `qwen3`): a Llama with an RMSNorm on each head of q
and k before the rotation (`qk_norm=rmsnorm(eps=rms_norm_eps)`, per head), a head width of its
own (`head_dim`, 128 by default) and Qwen 2's optional sliding window.

    config.json        spec
    rms_norm_eps       norm=rmsnorm(eps=...), qk_norm=rmsnorm(eps=...)
    head_dim           head_dim (absent: 128)
    attention_bias     qkv_bias, out_bias
    the rest           as Qwen 2's (`lmcore.hf.qwen2`)
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.qwen2 import WINDOW
from lmcore.hf.rules import Choice, Dropout, Field, Rope

DEFAULTS: Final = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}

FAMILY: Final = Family(
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "pos": "rope",
        "attn": "sdpa",
        "qk_norm": "rmsnorm",
    },
    rules=(
        *core(DEFAULTS, qk_norm=True),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Rope(),
        WINDOW,
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        *mlp(),
    ),
)
