"""GGUF `deepseek2` (DeepSeek-V2/V3's layout in llama.cpp) as a renaming onto lmcore's Hugging
Face family `deepseek_v3`: multi-head latent attention, sigmoid routing over expert groups with
the score-correction bias (`exp_probs_b`), shared experts, dense first layers.

Latent attention as llama.cpp stores it: `attn_q` (or `attn_q_a`, `attn_q_a_norm`, `attn_q_b`),
`attn_kv_a_mqa`, `attn_kv_a_norm`, then either the older `attn_kv_b` (Hugging Face's
`kv_b_proj`; `attention.key_length` = qk_nope + qk_rope, `value_length` = v_head_dim,
`head_count_kv` = the heads) or the newer split the converter writes now, read and written here:
`attn_k_b (heads, kv_lora_rank, qk_nope)` (each head's key rows of kv_b_proj, transposed) and
`attn_v_b (heads, v_head_dim, kv_lora_rank)`, with `key_length_mla` = qk_nope + qk_rope,
`value_length_mla` = v_head_dim (`key_length` = kv_lora_rank + qk_rope, `value_length` =
kv_lora_rank and `head_count_kv` = 1 describe llama.cpp's absorbed form, and are checked).

What llama.cpp fixes or defaults, set as it sets it: the rotation interleaved (its NORM rope:
transformers' `rope_interleave: true`), no attention biases, no grouping without
`expert_group_count`, no scaling without `expert_weights_scale`, no renormalising without
`expert_weights_norm`; `expert_gating_func` absent is softmax (DeepSeek-V2's), which lmcore's
DeepSeek-V3 family does not route by: refused, naming the key. YaRN: llama.cpp leaves the rotated
dimensions unscaled and scales q·k by mscale², mscale = 1 + 0.1 · m · ln(factor) with m =
`rope.scaling.yarn_log_multiplier` / 0.1 (the converter stores 0.1 · mscale_all_dim):
transformers' `mscale = mscale_all_dim = m`, so a model whose mscale and mscale_all_dim differ is
refused by `--to-gguf`; without the key, llama.cpp scales the rotated dimensions by g = 1 + 0.1 ·
ln(factor) and q·k by g² (transformers' `mscale_all_dim = 1, attention_factor = g`). llama.cpp's
latent norms take the file's `layer_norm_rms_epsilon`, transformers' (and so lmcore's family)
1e-6: a file whose eps is another is refused, naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.gguf.rows import Architecture, Derived, Meta, layer, positive

__all__ = ["DEEPSEEK2"]

_KEYS: Final = (
    "attention.key_length", "attention.value_length", "attention.key_length_mla",
    "attention.value_length_mla", "attention.head_count_kv",
)  # fmt: skip


def _widths_read(meta: Meta, config: dict[str, Any]) -> None:
    """The latent heads' widths from the new (`*_mla`) or the older keys; `head_count_kv` as
    the heads when it says the absorbed form's 1 (transformers: every head its own keys)."""
    rope = positive(meta.get("rope.dimension_count"))
    mla = "attention.key_length_mla" in meta
    key = meta.get("attention.key_length_mla" if mla else "attention.key_length")
    value = meta.get("attention.value_length_mla" if mla else "attention.value_length")
    width = positive(key)
    if width is not None and rope is not None:
        config["qk_nope_head_dim"] = width - rope
    elif key is not None:
        config["qk_nope_head_dim"] = key
    if value is not None:
        config["v_head_dim"] = value
    heads, kv = meta.get("attention.head_count"), meta.get("attention.head_count_kv")
    config["num_key_value_heads"] = heads if kv in (None, 1) else kv
    if mla:  # the absorbed form's widths, checked against the latent rank
        rank = positive(meta.get("attention.kv_lora_rank"))
        both = None if rank is None or rope is None else rank + rope
        for k, want in (("attention.key_length", both), ("attention.value_length", rank)):
            if k in meta and want is not None and meta[k] != want:
                config["kv_lora_rank"] = f"{rank} (but deepseek2.{k} is {meta[k]}, not {want})"


def _widths_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    rank, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    meta["attention.head_count_kv"] = 1
    meta["attention.key_length"] = rank + rope
    meta["attention.value_length"] = rank
    meta["attention.key_length_mla"] = config["qk_nope_head_dim"] + rope
    meta["attention.value_length_mla"] = config["v_head_dim"]


def _eps_read(meta: Meta, config: dict[str, Any]) -> None:
    """llama.cpp's latent norms take the file's eps; transformers' (and lmcore's family) 1e-6."""
    eps = config.get("rms_norm_eps")
    if isinstance(eps, float) and eps != 1e-6:
        config["rms_norm_eps"] = f"{eps} (llama.cpp's latent norms use it too, transformers' 1e-6)"


def _nothing(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    return None


def _gating_read(meta: Meta, config: dict[str, Any]) -> None:
    kind = meta.get("expert_gating_func")
    if kind != 2:  # 2: sigmoid; absent or 1: softmax, as llama.cpp reads it
        config["scoring_func"] = "softmax" if kind in (None, 1) else kind


def _gating_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta["expert_gating_func"] = 2


_YARN: Final = ("type", "factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow")
_YARN_KEYS: Final = tuple(f"rope.scaling.{k}" for k in (*_YARN, "yarn_log_multiplier"))


def _rope_read(meta: Meta, config: dict[str, Any]) -> None:
    kind = meta.get("rope.scaling.type")
    if kind in (None, "none"):
        config["rope_scaling"] = None
        return
    rope: dict[str, Any] = {"rope_type": kind}
    for key, name in (("factor", "factor"), ("original_context_length",
                      "original_max_position_embeddings"), ("yarn_beta_fast", "beta_fast"),
                      ("yarn_beta_slow", "beta_slow")):  # fmt: skip
        if f"rope.scaling.{key}" in meta:
            rope[name] = meta[f"rope.scaling.{key}"]
    log_mul = meta.get("rope.scaling.yarn_log_multiplier", 0.0)
    factor = rope.get("factor")
    if isinstance(log_mul, bool) or not isinstance(log_mul, (int, float)):
        rope["mscale"] = rope["mscale_all_dim"] = log_mul  # the family names its type
    elif log_mul:  # llama.cpp's `/= 0.1f`, to float32's digits
        rope["mscale"] = rope["mscale_all_dim"] = round(log_mul / 0.1, 6)
    elif isinstance(factor, (int, float)) and factor > 1:
        # without the key llama.cpp scales the rotated dimensions by its default attention
        # factor g = 1 + 0.1 ln(factor) and q·k by g²: transformers' mscale_all_dim 1
        rope["mscale_all_dim"], rope["attention_factor"] = 1.0, 1.0 + 0.1 * math.log(factor)
    config["rope_scaling"] = rope


def _rope_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    rope = config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") == "default":
        return
    meta["rope.scaling.type"] = rope["rope_type"]
    meta["rope.scaling.factor"] = rope.get("factor")
    meta["rope.scaling.original_context_length"] = rope.get("original_max_position_embeddings")
    meta["rope.scaling.yarn_beta_fast"] = float(rope.get("beta_fast", 32.0))
    meta["rope.scaling.yarn_beta_slow"] = float(rope.get("beta_slow", 1.0))
    # mscale written as mscale_all_dim: the read-back refuses a model where they differ
    meta["rope.scaling.yarn_log_multiplier"] = 0.1 * float(rope.get("mscale_all_dim") or 1.0)


def _kv_b(config: Mapping[str, Any]) -> tuple[int, int, int]:
    return config["num_attention_heads"], config["qk_nope_head_dim"], config["v_head_dim"]


def _join(tensors: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    """`attn_k_b` and `attn_v_b` as the one `kv_b_proj (heads · (qk_nope + v), kv_lora_rank)`."""
    for name in [n for n in tensors if n.endswith(".attn_k_b.weight")]:
        v_name = name.replace("attn_k_b", "attn_v_b")
        k_b, v_b = tensors[name], tensors.get(v_name)
        heads, nope, v = _kv_b(config)
        rank = config["kv_lora_rank"]
        if v_b is None or k_b.shape != (heads, rank, nope) or v_b.shape != (heads, v, rank):
            continue  # left as they are, for the family's strict check to name
        del tensors[name], tensors[v_name]
        i = name.split(".")[1]
        kv_b = torch.cat((k_b.transpose(1, 2), v_b), dim=1)  # (heads, nope + v, rank)
        tensors[f"model.layers.{i}.self_attn.kv_b_proj.weight"] = kv_b.flatten(0, 1)
    return tensors


def _split(
    tensors: dict[str, Tensor], config: Mapping[str, Any]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """`kv_b_proj` as the converter splits it for llama.cpp's absorbed attention."""
    heads, nope, v = _kv_b(config)
    out: dict[str, Tensor] = {}
    rest = dict(tensors)
    for name in [n for n in tensors if n.endswith(".self_attn.kv_b_proj.weight")]:
        kv_b = rest.pop(name).reshape(heads, nope + v, -1)
        k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
        at = f"blk.{name.split('.')[2]}."
        out[f"{at}attn_k_b.weight"] = k_b.transpose(1, 2).contiguous()
        out[f"{at}attn_v_b.weight"] = v_b.contiguous()
    return rest, out


_ATTN: Final = "self_attn"
_UNCHECKED: Final = ("(the latent widths)",)  # not _SHAPES' q and kv: the family checks these
DEEPSEEK2: Final = Architecture(
    name="deepseek2",
    family="deepseek_v3",
    model_type="deepseek_v3",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        ("attention.q_lora_rank", "q_lora_rank"),
        ("attention.kv_lora_rank", "kv_lora_rank"),
        ("rope.freq_base", "rope_theta"),
        ("rope.dimension_count", "qk_rope_head_dim"),
        ("leading_dense_block_count", "first_k_dense_replace"),
        ("expert_count", "n_routed_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
        ("expert_shared_count", "n_shared_experts"),
        ("expert_group_count", "n_group"),
        ("expert_group_used_count", "topk_group"),
        ("expert_weights_scale", "routed_scaling_factor"),
        ("expert_weights_norm", "norm_topk_prob"),
    ),
    head_keys=(),
    trivial={},
    tensors=(
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        layer("attn_norm.weight", "input_layernorm.weight"),
        layer("ffn_norm.weight", "post_attention_layernorm.weight"),
        *(
            layer(f"{g}.weight", f"{_ATTN}.{h}.weight")
            for g, h in (
                ("attn_q", "q_proj"),
                ("attn_q_a", "q_a_proj"),
                ("attn_q_a_norm", "q_a_layernorm"),
                ("attn_q_b", "q_b_proj"),
                ("attn_kv_a_mqa", "kv_a_proj_with_mqa"),
                ("attn_kv_a_norm", "kv_a_layernorm"),
                ("attn_kv_b", "kv_b_proj"),
                ("attn_output", "o_proj"),
            )
        ),
        layer("ffn_gate.weight", "mlp.gate_proj.weight"),
        layer("ffn_up.weight", "mlp.up_proj.weight"),
        layer("ffn_down.weight", "mlp.down_proj.weight"),
        layer("ffn_gate_inp.weight", "mlp.gate.weight"),
        layer("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
        layer("ffn_gate_exps.weight", "mlp.experts.{e}.gate_proj.weight"),
        layer("ffn_up_exps.weight", "mlp.experts.{e}.up_proj.weight"),
        layer("ffn_down_exps.weight", "mlp.experts.{e}.down_proj.weight"),
        layer("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"),
        layer("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
        layer("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"),
    ),
    defaults={
        "rope_theta": 10000.0,
        "q_lora_rank": None,
        "first_k_dense_replace": 0,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": False,
    },
    fixed={"rope_interleave": True, "attention_bias": False},
    derived=(
        Derived(
            _KEYS,
            _widths_read,
            _widths_write,
            (
                ("qk_nope_head_dim", "attention.key_length_mla"),
                ("v_head_dim", "attention.value_length_mla"),
                ("num_key_value_heads", "attention.head_count_kv"),
            ),
        ),
        Derived((), _eps_read, _nothing),
        Derived(
            ("expert_gating_func",),
            _gating_read,
            _gating_write,
            (("scoring_func", "expert_gating_func"),),
        ),
        Derived(
            _YARN_KEYS,
            _rope_read,
            _rope_write,
            (
                ("rope_scaling", "rope.scaling.type"),
                ("mscale_all_dim", "rope.scaling.yarn_log_multiplier"),
            ),
        ),
    ),
    shapes={
        **{name: _UNCHECKED for name in ("attn_q.weight", "attn_output.weight")},
        "exp_probs_b.bias": ("E",),
    },
    join=_join,
    split=_split,
)
