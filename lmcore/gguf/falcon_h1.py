"""GGUF `falcon-h1` (llama.cpp's FalconH1Model) onto lmcore's `falcon_h1` family: attention and
Mamba-2 side by side in each layer, then a SwiGLU. The converter folds every µP multiplier into
the weights and writes none of them, so a file reads as a falcon_h1 whose multipliers are 1:

    multiplier (config.json)             folded into (GGUF)
    embedding_multiplier, lm_head_...    token_embd, output
    attention_in_multiplier              attn_q, attn_k, attn_v (and key_multiplier: attn_k)
    attention_out_multiplier             attn_output
    ssm_in_multiplier, ssm_multipliers   ssm_in (its z, x, B, C, dt rows by the mup vector)
    ssm_out_multiplier                   ssm_out
    mlp_multipliers [gate, down]         ffn_gate, ffn_down

    GGUF                                 config.json
    ssm.inner_size, ssm.time_step_rank   mamba_d_ssm, mamba_n_heads (mamba_d_head: their quotient)
    ssm.state_size, ssm.group_count      mamba_d_state, mamba_n_groups
    ssm.conv_kernel                      mamba_d_conv
    attention.key_length                 head_dim

Writing folds them the same way (the same function up to float32 rounding); what a fold cannot
hold is refused by name: tied embeddings whose two multipliers differ, and what llama.cpp's graph
lacks (attention, MLP and projection biases; a norm before the gate, or none). Its rotation is
NeoX's (Hugging Face's half-split rows), so nothing is permuted; the pre-FFN norm is stored as
`blk.N.ffn_norm` (no `.weight`: gguf's map names it whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.gguf.rows import _ROPE, Architecture, Derived, Meta, layer

__all__ = ["FALCON_H1"]

_MULTIPLIERS: Final = ("embedding_multiplier", "lm_head_multiplier", "key_multiplier",
                       "attention_in_multiplier", "attention_out_multiplier",
                       "ssm_in_multiplier", "ssm_out_multiplier")  # fmt: skip


def _inner(config: Mapping[str, Any]) -> int:
    return int(config.get("mamba_d_ssm") or config.get("mamba_expand", 2) * config["hidden_size"])


def _one(config: Mapping[str, Any], name: str) -> float:
    value = config.get(name)
    return 1.0 if value is None else float(value)


def _folded(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config of the model the folded weights make: every multiplier 1, except a tied
    model's lm_head over embedding multiplier, which no weight can hold (refused by name)."""
    out = {**config, **{m: 1.0 for m in _MULTIPLIERS}}
    out["mlp_multipliers"], out["ssm_multipliers"] = [1.0] * 2, [1.0] * 5
    out["mamba_d_ssm"] = _inner(config)
    out["mamba_chunk_size"] = 256  # how the scan is split, not the function (no key holds it)
    if config.get("tie_word_embeddings"):
        out["lm_head_multiplier"] = _one(config, "lm_head_multiplier") / _one(
            config, "embedding_multiplier"
        )
    return out


def _fold(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    """The multipliers folded into the weights, as FalconH1Model.modify_tensors folds them;
    then Mamba-2's changes (A as -exp(A_log), D as (heads, 1), the norm as (groups, width))."""
    get = {m: _one(config, m) for m in _MULTIPLIERS}
    gate, down = config.get("mlp_multipliers") or [1.0, 1.0]
    mup = config.get("ssm_multipliers") or [1.0] * 5
    inner = _inner(config)
    gs = config["mamba_n_groups"] * config["mamba_d_state"]
    cuts = (0, inner, 2 * inner, 2 * inner + gs, 2 * inner + 2 * gs)
    attn_in = get["attention_in_multiplier"]
    by_suffix = {
        "self_attn.q_proj.weight": attn_in,
        "self_attn.k_proj.weight": attn_in * get["key_multiplier"],
        "self_attn.v_proj.weight": attn_in,
        "self_attn.o_proj.weight": get["attention_out_multiplier"],
        "mamba.out_proj.weight": get["ssm_out_multiplier"],
        "feed_forward.gate_proj.weight": float(gate),
        "feed_forward.down_proj.weight": float(down),
        "model.embed_tokens.weight": get["embedding_multiplier"],
        "lm_head.weight": get["lm_head_multiplier"],
    }
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        m = next((v for k, v in by_suffix.items() if name.endswith(k)), None)
        if m is not None:
            t = t * m
        elif name.endswith("mamba.in_proj.weight"):
            rows = torch.ones(t.shape[0], dtype=t.dtype)
            for start, end, value in zip(cuts, (*cuts[1:], t.shape[0]), mup, strict=True):
                rows[start:end] = float(value)
            t = t * get["ssm_in_multiplier"] * rows[:, None]
        elif name.endswith("mamba.A_log"):
            t = -torch.exp(t).reshape(-1, 1)
        elif name.endswith("mamba.D"):
            t = t.reshape(-1, 1)
        elif name.endswith("mamba.norm.weight"):
            t = t.reshape(config["mamba_n_groups"], -1)
        out[name] = t
    return out


def _unfolded(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    """Mamba-2's changes undone; the multipliers stay folded (the config's are 1)."""
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if name.endswith("mamba.A_log"):
            t = torch.log(-t.reshape(-1))
        elif name.endswith(("mamba.D", "mamba.norm.weight")):
            t = t.reshape(-1)
        out[name] = t
    return out


def _inner_read(meta: Meta, config: dict[str, Any]) -> None:
    if "ssm.inner_size" in meta:
        config["mamba_d_ssm"] = meta["ssm.inner_size"]


def _inner_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta["ssm.inner_size"] = _inner(config)


_AT: Final = "mamba"
FALCON_H1: Final = Architecture(
    name="falcon-h1",
    family="falcon_h1",
    model_type="falcon_h1",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("attention.key_length", "head_dim"),
        ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        ("rope.freq_base", "rope_theta"),
        ("ssm.conv_kernel", "mamba_d_conv"),
        ("ssm.state_size", "mamba_d_state"),
        ("ssm.time_step_rank", "mamba_n_heads"),
        ("ssm.group_count", "mamba_n_groups"),
    ),
    head_keys=("rope.dimension_count", "attention.value_length"),
    trivial={"rope.scaling.type": ("none",), "rope.scaling.factor": (1, 1.0)},
    tensors=(
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.final_layernorm.weight"),
        ("output.weight", "lm_head.weight"),
        layer("attn_norm.weight", "input_layernorm.weight"),
        layer("ffn_norm", "pre_ff_layernorm.weight"),
        layer("attn_q.weight", "self_attn.q_proj.weight"),
        layer("attn_k.weight", "self_attn.k_proj.weight"),
        layer("attn_v.weight", "self_attn.v_proj.weight"),
        layer("attn_output.weight", "self_attn.o_proj.weight"),
        layer("ssm_in.weight", f"{_AT}.in_proj.weight"),
        layer("ssm_conv1d.weight", f"{_AT}.conv1d.weight"),
        layer("ssm_conv1d.bias", f"{_AT}.conv1d.bias"),
        layer("ssm_dt.bias", f"{_AT}.dt_bias"),
        layer("ssm_a", f"{_AT}.A_log"),
        layer("ssm_d", f"{_AT}.D"),
        layer("ssm_norm.weight", f"{_AT}.norm.weight"),
        layer("ssm_out.weight", f"{_AT}.out_proj.weight"),
        layer("ffn_gate.weight", "feed_forward.gate_proj.weight"),
        layer("ffn_up.weight", "feed_forward.up_proj.weight"),
        layer("ffn_down.weight", "feed_forward.down_proj.weight"),
    ),
    defaults=_ROPE,
    # llama.cpp's graph: no biases but the convolution's, the gate before the grouped norm
    fixed={
        "attention_bias": False,
        "mlp_bias": False,
        "mamba_proj_bias": False,
        "projectors_bias": False,
        "mamba_conv_bias": True,
        "mamba_rms_norm": True,
        "mamba_norm_before_gate": False,
    },
    derived=(
        Derived(
            ("ssm.inner_size",), _inner_read, _inner_write, (("mamba_d_ssm", "ssm.inner_size"),)
        ),
    ),
    shapes={"ffn_norm": ("d",)},
    squeezed=("mamba.conv1d.weight",),
    undone=_unfolded,
    redone=_fold,
    folded=_folded,
)
