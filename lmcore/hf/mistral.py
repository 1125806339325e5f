"""Mistral (`MistralForCausalLM`, model_type `mistral`): a Llama with a sliding window on every
layer (`sliding_window`, null: none; `window=4096`) and no biases.

    config.json       spec
    sliding_window    window (0 when null)
    the rest          as Llama's (`lmcore.hf.llama`)
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Dropout, Rope, Window

DEFAULTS: Final = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}

FAMILY: Final = Family(
    model_type="mistral",
    architecture="MistralForCausalLM",
    spec={"block": "prenorm", "norm": "rmsnorm", "pos": "rope", "attn": "sdpa"},
    rules=(
        *core(DEFAULTS),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Rope(),
        Window(default=4096),
        Dropout(("attention_dropout",)),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        *attention(),
        *mlp(),
    ),
)
