"""Qwen 2 / 2.5 (`Qwen2ForCausalLM`, model_type `qwen2`): a Llama with biases on q, k and v
(`qkv_bias=true`; none on o) and an optional sliding window on the layers from
`max_window_layers` on (`use_sliding_window`, or the layers `layer_types` names).

    config.json                                          spec
    use_sliding_window, sliding_window, layer_types /
      max_window_layers                                  window[layers]=...
    the rest                                             as Llama's (`lmcore.hf.llama`)
"""

from __future__ import annotations

from typing import Final

from lmcore.hf.common import GATED, attention, core, ends, mlp, norms
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Draft, Dropout, Rope, Window

DEFAULTS: Final = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 22016,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
}


def from_max_window_layers(d: Draft, n: int) -> range:
    """transformers' default `layer_types`: the layers from `max_window_layers` on slide."""
    first = d.field("max_window_layers", 28)
    return range(max(first, 0), n) if isinstance(first, int) else range(n)


WINDOW: Final = Window(
    default=4096,
    gate="use_sliding_window",
    layer_types=True,
    default_types=from_max_window_layers,
    reads=("max_window_layers",),
)

FAMILY: Final = Family(
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    spec={"block": "prenorm", "norm": "rmsnorm", "pos": "rope", "attn": "sdpa", "qkv_bias": True},
    rules=(
        *core(DEFAULTS),
        Choice("hidden_act", GATED, "silu", what="a gated MLP's activation"),
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
