"""Mixtral (`MixtralForCausalLM`, model_type `mixtral`): Mistral with a mixture of SwiGLU
experts in every layer: a router picks `num_experts_per_tok` of `num_local_experts` per token,
its softmax weights renormalised over the chosen ones (`ffn=moe(num_experts=8, top_k=2,
renormalize=true)`), each expert `intermediate_size` wide.

    config.json                                  spec
    num_local_experts, num_experts_per_tok       ffn=moe(num_experts=..., top_k=...)
    intermediate_size                            d_ff (each expert's width)
    router_aux_loss_coef, output_router_logits   ffn=moe(aux_loss_coef=...): transformers adds
                                                 the loss only with output_router_logits, so 0
                                                 without it
    router_jitter_noise                          training-time noise (kept, not applied)
    the rest                                     as Mistral's (`lmcore.hf.mistral`)

transformers computes one load-balancing loss over all layers' router logits together, lmcore
one per layer, summed: they agree for one layer, not for several (the logits are the same).
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import attention, core, ends, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Dropout, Fixed, Moe, Rope, Window
from lmcore.hf.weights import weight

DEFAULTS: Final = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
MOE: Final = "model.layers.{i}.block_sparse_moe"
FAMILY: Final = Family(
    model_type="mixtral",
    architecture="MixtralForCausalLM",
    spec={"block": "prenorm", "norm": "rmsnorm", "pos": "rope", "attn": "sdpa"},
    rules=(
        *core(DEFAULTS, d_ff=False),
        Fixed("hidden_act", ("silu", "swish"), "lmcore's experts here are SwiGLU"),
        Moe(
            experts=("num_local_experts", "num_experts"),
            experts_default=8,
            top_k_default=2,
            renormalize=True,
        ),
        Rope(theta=1e6),
        Window(default=None),
        Dropout(("attention_dropout", "router_jitter_noise")),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        weight("layers.{i}.ffn.router.weight", f"{MOE}.gate.weight"),
        *(
            weight(f"layers.{{i}}.ffn.experts.{{e}}.{w}.weight", f"{MOE}.experts.{{e}}.{w}.weight")
            for w in ("w1", "w2", "w3")
        ),
    ),
)
