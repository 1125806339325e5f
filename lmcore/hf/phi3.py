"""Phi-3 (`Phi3ForCausalLM`, model_type `phi3`): a Llama whose q, k and v projections are one
matrix (`qkv_proj`, split into lmcore's three and fused again) as are the MLP's gate and up
(`gate_up_proj`: w1 then w3), with an optional partial rotation (`partial_rotary_factor`:
`rope(fraction=...)`) and sliding window. LongRoPE (`rope_scaling.type: longrope`, the 128k
models) is refused: lmcore's rope has no such scaling.

    config.json              spec
    partial_rotary_factor    pos=rope(fraction=...)
    sliding_window           window (null: 0)
    the rest                 as Llama's (`lmcore.hf.llama`), without biases
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import GATED, attention, core, ends, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Dropout, Rope, Window
from lmcore.hf.weights import Fused, weight

DEFAULTS: Final = {
    "vocab_size": 32064,
    "hidden_size": 3072,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}

AT: Final = "model.layers.{i}"
FAMILY: Final = Family(
    model_type="phi3",
    architecture="Phi3ForCausalLM",
    spec={"block": "prenorm", "norm": "rmsnorm", "pos": "rope", "attn": "sdpa"},
    rules=(
        *core(DEFAULTS),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
        Rope(fraction_names=("partial_rotary_factor",)),
        Window(default=None),
        Dropout(("attention_dropout", "resid_pdrop", "embd_pdrop")),
    ),
    tensors=(
        *ends(),
        *norms({"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}),
        weight(
            (
                "layers.{i}.attn.q_proj.weight",
                "layers.{i}.attn.k_proj.weight",
                "layers.{i}.attn.v_proj.weight",
            ),
            f"{AT}.self_attn.qkv_proj.weight",
            Fused((True, True, False)),
        ),
        *(w for w in attention() if "output_proj" in w.ours[0]),
        weight(
            ("layers.{i}.ffn.w1.weight", "layers.{i}.ffn.w3.weight"),
            f"{AT}.mlp.gate_up_proj.weight",
            Fused((False, False)),
        ),
        weight("layers.{i}.ffn.w2.weight", f"{AT}.mlp.down_proj.weight"),
    ),
    # Read only by LongRoPE, which is refused: kept as it is.
    passive=frozenset({"original_max_position_embeddings"}),
)
