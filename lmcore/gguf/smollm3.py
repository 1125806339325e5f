"""GGUF `smollm3` (llama.cpp's SmolLM3Model, a LlamaModel): Llama's metadata and tensors, q/k
rows permuted as Llama's, onto lmcore's `smollm3` family. llama.cpp fixes what the file does not
say: every fourth layer rotates nothing (`n_no_rope_layer_step = 4`: `pos[3::4]=nope`) and no
layer slides; a SmolLM3 with another NoPE pattern or a window is refused on writing, by name.
"""

from __future__ import annotations

from typing import Final

from lmcore.gguf.rows import (
    _ATTENTION,
    _ENDS,
    _HEAD_KEYS,
    _LLAMA_FIELDS,
    _LLAMA_PERMUTED,
    _MLP,
    _NO_EXPERTS,
    _NO_SCALING,
    _PRENORMS,
    _ROPE,
    Architecture,
)

__all__ = ["SMOLLM3"]

SMOLLM3: Final = Architecture(
    name="smollm3",
    family="smollm3",
    model_type="smollm3",
    fields=_LLAMA_FIELDS,
    head_keys=_HEAD_KEYS,
    trivial={**_NO_SCALING, **_NO_EXPERTS},
    tensors=(*_ENDS, *_PRENORMS, *_ATTENTION, *_MLP),
    permuted=_LLAMA_PERMUTED,
    defaults=_ROPE,
    fixed={"no_rope_layer_interval": 4, "use_sliding_window": False},
)
