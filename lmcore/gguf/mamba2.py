"""GGUF `mamba2` (llama.cpp's Mamba2Model) onto lmcore's `mamba2` family: Mamba-2 (SSD) layers
alone. The converter writes `attention.head_count` and `feed_forward_length` 0 (unused) and a
context length of 2**20 (Mamba-2 has no limit), stores A_log as `ssm_a` = -exp(A_log) and D as
(heads, 1), the gated norm's gain as (groups, width / groups), the convolution's filter 2-D.

    GGUF                                config.json
    ssm.inner_size                      expand x hidden_size (= num_heads x head_dim)
    ssm.time_step_rank                  num_heads (the SSM heads)
    ssm.state_size, ssm.group_count     state_size, n_groups
    ssm.conv_kernel                     conv_kernel
    attention.layer_norm_rms_epsilon    layer_norm_epsilon

llama.cpp's graph has no in/out projection biases (`use_bias`) and always a convolution bias
(`use_conv_bias`): a model otherwise is refused on writing, a file otherwise on reading, by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.gguf.rows import Architecture, Derived, Meta, positive

__all__ = ["MAMBA2"]

_AT: Final = "backbone.layers.{i}"


def _joined(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if name.endswith("mixer.A_log"):
            t = torch.log(-t.reshape(-1))
        elif name.endswith(("mixer.D", "mixer.norm.weight")):
            t = t.reshape(-1)
        out[name] = t
    return out


def _split(state: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for name, t in state.items():
        if name.endswith("mixer.A_log"):
            t = -torch.exp(t).reshape(-1, 1)
        elif name.endswith("mixer.D"):
            t = t.reshape(-1, 1)
        elif name.endswith("mixer.norm.weight"):
            t = t.reshape(config["n_groups"], -1)
        out[name] = t
    return out


def _inner_read(meta: Meta, config: dict[str, Any]) -> None:
    inner, d = meta.get("ssm.inner_size"), positive(meta.get("embedding_length"))
    heads = positive(meta.get("ssm.time_step_rank"))
    if inner is None:
        return
    if not positive(inner) or d is None or heads is None or inner % d or inner % heads:
        config["expand"] = inner  # the family names what it cannot read
        return
    config["expand"], config["head_dim"] = inner // d, inner // heads


def _inner_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta["ssm.inner_size"] = config["num_heads"] * config["head_dim"]
    meta["attention.head_count"] = 0  # unused, but llama.cpp's loader requires them
    meta["feed_forward_length"] = 0


MAMBA2: Final = Architecture(
    name="mamba2",
    family="mamba2",
    model_type="mamba2",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("ssm.time_step_rank", "num_heads"),
        ("ssm.state_size", "state_size"),
        ("ssm.group_count", "n_groups"),
        ("ssm.conv_kernel", "conv_kernel"),
        ("attention.layer_norm_rms_epsilon", "layer_norm_epsilon"),
    ),
    head_keys=(),
    trivial={"attention.head_count": (0,), "feed_forward_length": (0,)},
    tensors=(
        ("token_embd.weight", "backbone.embeddings.weight"),
        ("output_norm.weight", "backbone.norm_f.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.{i}.attn_norm.weight", f"{_AT}.norm.weight"),
        ("blk.{i}.ssm_in.weight", f"{_AT}.mixer.in_proj.weight"),
        ("blk.{i}.ssm_conv1d.weight", f"{_AT}.mixer.conv1d.weight"),
        ("blk.{i}.ssm_conv1d.bias", f"{_AT}.mixer.conv1d.bias"),
        ("blk.{i}.ssm_dt.bias", f"{_AT}.mixer.dt_bias"),
        ("blk.{i}.ssm_a", f"{_AT}.mixer.A_log"),
        ("blk.{i}.ssm_d", f"{_AT}.mixer.D"),
        ("blk.{i}.ssm_norm.weight", f"{_AT}.mixer.norm.weight"),
        ("blk.{i}.ssm_out.weight", f"{_AT}.mixer.out_proj.weight"),
    ),
    fixed={"use_bias": False, "use_conv_bias": True},
    derived=(
        Derived(
            ("ssm.inner_size",),
            _inner_read,
            _inner_write,
            (("expand", "ssm.inner_size"), ("head_dim", "ssm.inner_size")),
        ),
    ),
    squeezed=("mixer.conv1d.weight",),
    undone=_joined,
    redone=_split,
)
