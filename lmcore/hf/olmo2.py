"""OLMo 2 (`Olmo2ForCausalLM`, model_type `olmo2`): a Llama whose norms sit on each sub-layer's
output before the residual add (`block=reordered`), with RMSNorms over the full width of q and
k before the rotation (`qk_norm=rmsnorm(eps=rms_norm_eps), qk_norm_scope=full`).

    config.json     spec
    rms_norm_eps    norm=rmsnorm(eps=...), qk_norm=rmsnorm(eps=...)
    attention_bias  qkv_bias, out_bias
    the rest        as Llama's (`lmcore.hf.llama`)

State-dict keys: post_attention_layernorm and post_feedforward_layernorm are `ln1_out` and
`ln2_out`; self_attn.q_norm / k_norm are `attn.q_norm` / `attn.k_norm` (rows permuted with q, k).
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Dropout, Field, Rope

DEFAULTS: Final = {
    "vocab_size": 50304,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 11008,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}

FAMILY: Final = Family(
    model_type="olmo2",
    architecture="Olmo2ForCausalLM",
    spec={
        "block": "reordered",
        "norm": "rmsnorm",
        "pos": "rope",
        "attn": "sdpa",
        "qk_norm": "rmsnorm",
        "qk_norm_scope": "full",
    },
    rules=(
        *core(DEFAULTS, qk_norm=True),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Rope(),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1_out": "post_attention_layernorm", "ln2_out": "post_feedforward_layernorm"}),
        *attention(),
        *mlp(),
    ),
)
