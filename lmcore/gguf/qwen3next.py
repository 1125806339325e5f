"""GGUF `qwen3next` (llama.cpp's Qwen3NextModel, a Qwen2MoeModel) onto lmcore's `qwen3_next`
family: gated DeltaNet layers (`ssm_*`) with a gated-attention layer every
`full_attention_interval`-th, every layer's FFN the experts with a gated shared expert.

What llama.cpp's converter changes, undone on reading and redone on writing (`_joined`,
`_split`):
  - `linear_attn.in_proj_qkvz` (rows grouped by key head: q, k, v, z of each) split into
    `attn_qkv` (every q row, then every k, then every v) and `attn_gate` (every z row);
  - `A_log` stored as `ssm_a` = -exp(A_log); `dt_bias` as `ssm_dt.bias`;
  - every RMSNorm gain stored + 1 (zero-centred), except the DeltaNet's gated norm (`ssm_norm`);
  - the convolution's filter 2-D, (channels, taps).

    GGUF                                     config.json
    ssm.conv_kernel, ssm.state_size,         linear_conv_kernel_dim, linear_key_head_dim,
      ssm.group_count, ssm.time_step_rank      linear_num_key_heads, linear_num_value_heads
    ssm.inner_size                           linear_value_head_dim x linear_num_value_heads
    rope.dimension_count                     partial_rotary_factor x head_dim
    expert_shared_feed_forward_length        shared_expert_intermediate_size

llama.cpp's graph makes every layer sparse and renormalises the top-k weights; a model with dense
layers or without renormalising is refused on writing, by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.gguf.rows import (
    _ATTENTION,
    _ENDS,
    _LLAMA_FIELDS,
    _NO_SCALING,
    _QK_NORMS,
    _ROPE,
    Architecture,
    Derived,
    Meta,
    _experts,
    layer,
    positive,
)

__all__ = ["QWEN3NEXT"]

_QKVZ: Final = "linear_attn.in_proj_qkvz.weight"
_QKV: Final = "linear_attn.in_proj_qkv.weight"  # named here only: GGUF's attn_qkv
_Z: Final = "linear_attn.in_proj_z.weight"  # GGUF's attn_gate
_GATED_NORM: Final = "linear_attn.norm.weight"


def _widths(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """Key heads, a key head's width, and its value rows (its value heads' together)."""
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    return nk, config["linear_key_head_dim"], nv // nk * config["linear_value_head_dim"]


def _joined(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if name.endswith(_Z):
            continue
        if name.endswith(_QKV) and name.replace(_QKV, _Z) in state:
            nk, hk, hv = _widths(config)
            z = state[name.replace(_QKV, _Z)]
            q, k, v = torch.split(t, [nk * hk, nk * hk, nk * hv])
            groups = [x.reshape(nk, -1, x.shape[-1]) for x in (q, k, v, z)]
            out[name.replace(_QKV, _QKVZ)] = torch.cat(groups, 1).reshape(-1, t.shape[-1])
            continue
        if name.endswith("linear_attn.A_log"):
            t = torch.log(-t)
        elif name.endswith("norm.weight") and not name.endswith(_GATED_NORM):
            t = t - 1
        out[name] = t
    return out


def _split(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if name.endswith(_QKVZ):
            nk, hk, hv = _widths(config)
            q, k, v, z = torch.split(t.reshape(nk, -1, t.shape[-1]), [hk, hk, hv, hv], 1)
            flat = [x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)]
            out[name.replace(_QKVZ, _QKV)] = torch.cat(flat[:3])
            out[name.replace(_QKVZ, _Z)] = flat[3]
            continue
        if name.endswith("linear_attn.A_log"):
            t = -torch.exp(t)
        elif name.endswith("norm.weight") and not name.endswith(_GATED_NORM):
            t = t + 1
        out[name] = t
    return out


def _inner_read(meta: Meta, config: dict[str, Any]) -> None:
    inner, rank = meta.get("ssm.inner_size"), positive(meta.get("ssm.time_step_rank"))
    if inner is None:
        return
    ok = positive(inner) and rank and inner % rank == 0
    config["linear_value_head_dim"] = inner // rank if ok and rank else inner


def _inner_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta["ssm.inner_size"] = config["linear_value_head_dim"] * config["linear_num_value_heads"]


def _interval_read(meta: Meta, config: dict[str, Any]) -> None:
    if "full_attention_interval" in meta:
        config["full_attention_interval"] = meta["full_attention_interval"]


def _interval_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """The interval whose every k-th layer attends, when one gives the model's layer types
    (else none is written, and the read-back check names the layers)."""
    types = config.get("layer_types")
    if not isinstance(types, list):
        meta["full_attention_interval"] = config.get("full_attention_interval", 4)
        return
    n = len(types)
    for k in range(1, n + 1):
        if types == ["full_attention" if (i + 1) % k == 0 else "linear_attention"
                     for i in range(n)]:  # fmt: skip
            meta["full_attention_interval"] = k
            return


def _rot_read(meta: Meta, config: dict[str, Any]) -> None:
    rot, width = meta.get("rope.dimension_count"), positive(meta.get("attention.key_length"))
    if rot is not None:
        config["partial_rotary_factor"] = rot / width if positive(rot) and width else rot


def _rot_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    fraction = config.get("partial_rotary_factor")
    meta["rope.dimension_count"] = int(head_dim * (0.25 if fraction is None else fraction))


_AT: Final = "linear_attn"
QWEN3NEXT: Final = Architecture(
    name="qwen3next",
    family="qwen3_next",
    model_type="qwen3_next",
    fields=(
        *_LLAMA_FIELDS,
        ("attention.key_length", "head_dim"),
        ("expert_count", "num_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
        ("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
        ("ssm.conv_kernel", "linear_conv_kernel_dim"),
        ("ssm.state_size", "linear_key_head_dim"),
        ("ssm.group_count", "linear_num_key_heads"),
        ("ssm.time_step_rank", "linear_num_value_heads"),
    ),
    head_keys=("attention.value_length",),
    trivial=_NO_SCALING,
    tensors=(
        *_ENDS,
        layer("attn_norm.weight", "input_layernorm.weight"),
        layer("post_attention_norm.weight", "post_attention_layernorm.weight"),
        *_ATTENTION,
        *_QK_NORMS,
        layer("attn_qkv.weight", _QKV),
        layer("attn_gate.weight", _Z),
        layer("ssm_a", f"{_AT}.A_log"),
        layer("ssm_dt.bias", f"{_AT}.dt_bias"),
        layer("ssm_conv1d.weight", f"{_AT}.conv1d.weight"),
        layer("ssm_ba.weight", f"{_AT}.in_proj_ba.weight"),
        layer("ssm_norm.weight", _GATED_NORM),
        layer("ssm_out.weight", f"{_AT}.out_proj.weight"),
        *_experts("mlp", ("gate_proj", "up_proj", "down_proj")),
        layer("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"),
        layer("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
        layer("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"),
        layer("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    ),
    defaults=_ROPE,
    fixed={"norm_topk_prob": True, "mlp_only_layers": [], "decoder_sparse_step": 1},
    derived=(
        Derived(
            ("ssm.inner_size",),
            _inner_read,
            _inner_write,
            (("linear_value_head_dim", "ssm.inner_size"),),
        ),
        Derived(
            ("full_attention_interval",),
            _interval_read,
            _interval_write,
            (("full_attention_interval", "full_attention_interval"),),
        ),
        Derived(
            ("rope.dimension_count",),
            _rot_read,
            _rot_write,
            (("partial_rotary_factor", "rope.dimension_count"),),
        ),
    ),
    # the gated q (query and gate rows) and the DeltaNet's qkv are not attention's widths
    shapes={"attn_q.weight": ("q2", "d"), "attn_qkv.weight": ("dqkv", "d")},
    squeezed=(f"{_AT}.conv1d.weight",),
    undone=_joined,
    redone=_split,
)
