"""GGUF `olmo2` with `attention.sliding_window` (llama.cpp's Olmo2Model writes OLMo 3 so) onto
lmcore's `olmo3` family: OLMo 2's tensors, a window on the layers
`attention.sliding_window_pattern` marks (absent, three in four, as the converter and
transformers default), and one `rope.freq_base` for every layer (llama.cpp's graph rotates the
sliding layers with the full layers' base).

    GGUF                                     config.json
    attention.sliding_window                 sliding_window
    attention.sliding_window_pattern         layer_types (true: sliding_attention)
    rope.freq_base                           rope_parameters: both layer types' rope_theta

The long-context checkpoints' YaRN on the full layers (`rope.scaling.type` yarn) is refused by
name: llama.cpp's YaRN is not transformers' to float32 rounding, so it is not claimed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from lmcore.gguf.rows import (
    _ATTENTION,
    _ENDS,
    _HEAD_KEYS,
    _LLAMA_FIELDS,
    _MLP,
    _NO_EXPERTS,
    _NO_SCALING,
    _QK_NORMS,
    Architecture,
    Derived,
    Meta,
    layer,
)
from lmcore.hf.rules import FULL, SLIDING

__all__ = ["OLMO3"]

_PATTERN: Final = "attention.sliding_window_pattern"
_BASE: Final = "rope.freq_base"


def _pattern_read(meta: Meta, config: dict[str, Any]) -> None:
    pattern = meta.get(_PATTERN)
    if isinstance(pattern, list) and all(type(p) is bool for p in pattern):
        config["layer_types"] = [SLIDING if p else FULL for p in pattern]
    elif pattern is not None:
        config["layer_types"] = pattern  # the family names what it cannot read


def _pattern_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta[_PATTERN] = [t == SLIDING for t in config["layer_types"]]


def _base_read(meta: Meta, config: dict[str, Any]) -> None:
    theta = meta.get(_BASE, 10000.0)  # llama.cpp's base when the key is absent
    config["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": theta}
                                 for t in (SLIDING, FULL)}  # fmt: skip


def _base_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    meta[_BASE] = config["rope_parameters"][FULL]["rope_theta"]


OLMO3: Final = Architecture(
    name="olmo2",
    family="olmo3",
    model_type="olmo3",
    fields=(
        *_LLAMA_FIELDS[:-1],  # all but rope.freq_base, derived here
        ("attention.sliding_window", "sliding_window"),
    ),
    head_keys=_HEAD_KEYS,
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(
        *_ENDS,
        *_ATTENTION,
        *_MLP,
        *_QK_NORMS,
        layer("post_attention_norm.weight", "post_attention_layernorm.weight"),
        layer("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
    ),
    derived=(
        Derived((_PATTERN,), _pattern_read, _pattern_write, (("layer_types", _PATTERN),)),
        Derived((_BASE,), _base_read, _base_write, (("rope_parameters", _BASE),)),
    ),
    shapes={"attn_q_norm.weight": ("q",), "attn_k_norm.weight": ("kv",)},
)
