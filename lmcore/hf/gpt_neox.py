"""GPT-NeoX / Pythia (`GPTNeoXForCausalLM`, model_type `gpt_neox`): attention and MLP read the
same stream, each through its own LayerNorm (`block=parallel(norms=2)`; with
`use_parallel_residual: false`, pre-norm), a rotation of the first quarter of each head
(`rotary_pct`: `rope(fraction=0.25)`), biases everywhere and an exact-GELU MLP. Its
`query_key_value` holds, for each head in turn, that head's q, k and v rows: split and fused
again.

    config.json                      spec
    use_parallel_residual            block=parallel(norms=2) | prenorm
    rotary_pct, rotary_emb_base      pos=rope(fraction=..., theta=...)
    layer_norm_eps                   norm=layernorm(eps=...)
    hidden_act                       ffn=gelu(bias=true)
    attention_bias                   qkv_bias, out_bias
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from lmcore.hf.common import UNGATED, core, ends
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Dropout, Field, Rope
from lmcore.hf.weights import COPY, Layout, PerHead, Weight, weight

DEFAULTS: Final = {
    "vocab_size": 50432,
    "hidden_size": 6144,
    "num_hidden_layers": 44,
    "num_attention_heads": 64,
    "intermediate_size": 24576,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "layer_norm_eps": 1e-5,
}
L: Final = "gpt_neox.layers.{i}"
BLOCKS: Final[Mapping[bool, Mapping[str, Any]]] = {
    True: {"block": "parallel", "block.norms": 2},
    False: {"block": "prenorm"},
}


def _both(ours: str, theirs: str, layout: Layout = COPY) -> tuple[Weight, ...]:
    """A weight and a bias, each one Hugging Face tensor holding the lmcore tensors `ours`."""
    return tuple(
        weight(tuple(f"{o}.{p}" for o in ours.split()), f"{theirs}.{p}", layout)
        for p in ("weight", "bias")
    )


FAMILY: Final = Family(
    model_type="gpt_neox",
    architecture="GPTNeoXForCausalLM",
    spec={"norm": "layernorm", "ffn.bias": True, "pos": "rope", "attn": "sdpa"},
    rules=(
        *core(DEFAULTS, head_dim=False, eps="layer_norm_eps"),
        Choice("use_parallel_residual", BLOCKS, True, what="the block's wiring"),
        Choice("hidden_act", UNGATED, "gelu", what="an MLP's activation"),
        Field("attention_bias", ("qkv_bias", "out_bias"), bool, True),
        Rope(theta_names=("rotary_emb_base",), fraction=0.25, fraction_names=("rotary_pct",)),
        Dropout(("attention_dropout", "hidden_dropout")),
    ),
    tensors=(
        *ends("gpt_neox.embed_in.weight", "gpt_neox.final_layer_norm", "embed_out.weight"),
        *_both("layers.{i}.ln1", f"{L}.input_layernorm"),
        *_both("layers.{i}.ln2", f"{L}.post_attention_layernorm"),
        *_both(
            "layers.{i}.attn.q_proj layers.{i}.attn.k_proj layers.{i}.attn.v_proj",
            f"{L}.attention.query_key_value",
            PerHead((True, True, False)),
        ),
        *_both("layers.{i}.attn.output_proj", f"{L}.attention.dense"),
        *_both("layers.{i}.ffn.w1", f"{L}.mlp.dense_h_to_4h"),
        *_both("layers.{i}.ffn.w2", f"{L}.mlp.dense_4h_to_h"),
    ),
    embedding="gpt_neox.embed_in.weight",
    head="embed_out.weight",
    prefix="gpt_neox.",
    skip=(".rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias"),
)
