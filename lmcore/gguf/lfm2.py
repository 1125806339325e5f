"""GGUF `lfm2` (llama.cpp's LFM2Model) onto lmcore's `lfm2` family: gated short-convolution
layers between attention layers, told apart by `attention.head_count_kv`, an array with 0 on each
convolution layer (as llama.cpp reads it: `recurrent_layer_arr[il] = n_head_kv(il) == 0`).

    GGUF                                     config.json
    attention.head_count_kv [0, 2, 0]        layer_types [conv, full_attention, conv],
                                             num_key_value_heads 2
    feed_forward_length (the SwiGLU's width) intermediate_size, block_auto_adjust_ff_dim false
    shortconv.l_cache                        conv_L_cache
    attention.layer_norm_rms_epsilon         norm_eps
    token_embd_norm.weight                   model.embedding_norm.weight (the final norm)
    blk.N.shortconv.conv.weight (d, taps)    model.layers.N.conv.conv.weight (d, 1, taps)

The converter writes the width transformers computes from `block_ff_dim` and its adjustments;
llama.cpp's graph has no convolution biases (`conv_bias`), so a model with them is refused on
writing, and a file holding them is refused on reading, by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from lmcore.gguf.rows import _ATTENTION, _ROPE, Architecture, Derived, Meta, layer
from lmcore.hf.lfm2 import CONV, WIDTH, ff_width
from lmcore.hf.rules import FULL

__all__ = ["LFM2"]

_KV: Final = "attention.head_count_kv"


def _kv_read(meta: Meta, config: dict[str, Any]) -> None:
    """Per-layer key-value heads -> the attention layers and their heads (one count for all;
    several are passed on as given, for the family to name)."""
    kv = meta.get(_KV)
    if isinstance(kv, list) and kv and all(type(k) is int and k >= 0 for k in kv):
        heads = {k for k in kv if k}
        config["layer_types"] = [FULL if k else CONV for k in kv]
        config["num_key_value_heads"] = heads.pop() if len(heads) == 1 else kv
    elif kv is not None:
        config["num_key_value_heads"] = kv  # an int: every layer attends; else the family names it


def _kv_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    kv = config["num_key_value_heads"] or config["num_attention_heads"]
    meta[_KV] = [0 if t == CONV else kv for t in config["layer_types"]]


def _ff_read(meta: Meta, config: dict[str, Any]) -> None:
    if "feed_forward_length" in meta:
        config["intermediate_size"] = meta["feed_forward_length"]


def _ff_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """The width transformers' Lfm2MLP computes, as the converter writes it."""
    size = config.get("block_ff_dim") or config.get("intermediate_size", WIDTH["intermediate_size"])
    get = {k: config.get(k, v) for k, v in WIDTH.items()}
    adjust, multiplier, multiple = (
        get[k]
        for k in ("block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of")
    )
    meta["feed_forward_length"] = ff_width(size, adjust, multiplier, multiple)


LFM2: Final = Architecture(
    name="lfm2",
    family="lfm2",
    model_type="lfm2",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.layer_norm_rms_epsilon", "norm_eps"),
        ("rope.freq_base", "rope_theta"),
        ("shortconv.l_cache", "conv_L_cache"),
    ),
    head_keys=("rope.dimension_count", "attention.key_length", "attention.value_length"),
    trivial={"rope.scaling.type": ("none",), "expert_count": (0,)},
    tensors=(
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("token_embd_norm.weight", "model.embedding_norm.weight"),
        ("output.weight", "lm_head.weight"),
        layer("attn_norm.weight", "operator_norm.weight"),
        layer("ffn_norm.weight", "ffn_norm.weight"),
        *(_ATTENTION[:3]),
        layer("attn_output.weight", "self_attn.out_proj.weight"),
        layer("attn_q_norm.weight", "self_attn.q_layernorm.weight"),
        layer("attn_k_norm.weight", "self_attn.k_layernorm.weight"),
        layer("shortconv.conv.weight", "conv.conv.weight"),
        layer("shortconv.in_proj.weight", "conv.in_proj.weight"),
        layer("shortconv.out_proj.weight", "conv.out_proj.weight"),
        layer("ffn_gate.weight", "feed_forward.w1.weight"),
        layer("ffn_up.weight", "feed_forward.w3.weight"),
        layer("ffn_down.weight", "feed_forward.w2.weight"),
    ),
    defaults=_ROPE,
    fixed={"block_auto_adjust_ff_dim": False, "conv_bias": False},
    derived=(
        Derived((_KV,), _kv_read, _kv_write, (("num_key_value_heads", _KV), ("layer_types", _KV))),
        Derived(
            ("feed_forward_length",),
            _ff_read,
            _ff_write,
            (("intermediate_size", "feed_forward_length"),),
        ),
    ),
    shapes={"token_embd_norm.weight": ("d",)},
    squeezed=("conv.conv.weight",),
)
