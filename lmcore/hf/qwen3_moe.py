"""Qwen3-MoE (`Qwen3MoeForCausalLM`, model_type `qwen3_moe`): Qwen 3's attention (per-head q/k
RMSNorms) with a mixture of SwiGLU experts `moe_intermediate_size` wide: the router's softmax
over `num_experts`, the top `num_experts_per_tok`, renormalised when `norm_topk_prob`. Layers in
`mlp_only_layers` (and those `decoder_sparse_step` skips) keep a dense SwiGLU
`intermediate_size` wide: `ffn[layers]=swiglu, d_ff[layers]=...`.

    config.json                                   spec
    num_experts, num_experts_per_tok              ffn=moe(num_experts=..., top_k=...)
    norm_topk_prob                                ffn=moe(renormalize=...)
    moe_intermediate_size, intermediate_size      d_ff (experts), d_ff[dense layers]
    mlp_only_layers, decoder_sparse_step          ffn[layers]=swiglu
    router_aux_loss_coef, output_router_logits    ffn=moe(aux_loss_coef=...), as Mixtral's
    use_sliding_window, sliding_window            window (every layer)
    the rest                                      as Qwen 3's (`lmcore.hf.qwen3`)

`max_window_layers` is written by Qwen's tools but not read by transformers' Qwen3-MoE: kept.
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Dropout, Field, Fixed, Moe, Rope, Window
from lmcore.hf.weights import weight

DEFAULTS: Final = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}
AT: Final = "model.layers.{i}.mlp"
FAMILY: Final = Family(
    model_type="qwen3_moe",
    architecture="Qwen3MoeForCausalLM",
    spec={
        "block": "prenorm",
        "norm": "rmsnorm",
        "pos": "rope",
        "attn": "sdpa",
        "qk_norm": "rmsnorm",
    },
    rules=(
        *core(DEFAULTS, d_ff=False, qk_norm=True),
        Fixed("hidden_act", ("silu", "swish"), "lmcore's experts here are SwiGLU"),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, False),
        Moe(
            experts=("num_experts", "num_local_experts"),
            experts_default=128,
            top_k_default=8,
            renormalize="norm_topk_prob",
            d_ff="moe_intermediate_size",
            dense="mlp_only_layers",
            step="decoder_sparse_step",
        ),
        Rope(),
        Window(default=4096, gate="use_sliding_window"),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        *mlp(),
        weight("layers.{i}.ffn.router.weight", f"{AT}.gate.weight"),
        *(
            weight(
                f"layers.{{i}}.ffn.experts.{{e}}.{ours}.weight", f"{AT}.experts.{{e}}.{hf}.weight"
            )
            for ours, hf in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))
        ),
    ),
    passive=frozenset({"max_window_layers"}),
)
