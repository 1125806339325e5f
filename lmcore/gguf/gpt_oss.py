"""GGUF `gpt-oss` as a renaming onto lmcore's Hugging Face family `gpt_oss` (its row in
`lmcore.gguf.architectures.ARCHITECTURES`).

What llama.cpp's converter (GptOssModel) changes, undone here on reading and redone on writing:
the experts' fused, transposed `gate_up_proj (E, d, 2·ff)`, whose columns alternate gate and up,
is stored as `ffn_gate_exps` and `ffn_up_exps (E, ff, d)` (and their biases `(E, ff)`), and
`down_proj (E, ff, d)` transposed as `ffn_down_exps (E, d, ff)`; the router is `ffn_gate_inp`
(with its bias), the sinks `attn_sinks.weight`, the norm before the experts
`post_attention_norm`.

What llama.cpp's gpt-oss graph fixes and the file does not say, set as it sets it: the clamped
SwiGLU's alpha 1.702 and limit 7.0, the window on the even layers (`set_swa_pattern(2)`), and a
YaRN whose correction range is truncated (ggml's `rope_yarn_corr_dims` rounds it outwards, as
transformers' GGUF loader reads it too; gpt-oss's own config says `truncate: false`, which no
GGUF key holds: such a model is refused by `--to-gguf`, naming it). Expert tensors stored as
MXFP4 are dequantized by the gguf package like any other type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.gguf.rows import Architecture, Derived, Meta, both, layer

__all__ = ["GPT_OSS"]

_AT: Final = "model.layers.{i}.mlp.experts"
_EXPERTS: Final = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def _rope_read(meta: Meta, config: dict[str, Any]) -> None:
    """`rope.scaling.*` to the rope dict (no scaling: "default", not gpt-oss's YaRN default)."""
    kind = meta.get("rope.scaling.type")
    if kind in (None, "none"):
        config["rope_scaling"] = {"rope_type": "default"}
        return
    rope: dict[str, Any] = {"rope_type": kind}
    for key, name in (("factor", "factor"), ("original_context_length",
                      "original_max_position_embeddings"), ("yarn_beta_fast", "beta_fast"),
                      ("yarn_beta_slow", "beta_slow")):  # fmt: skip
        if f"rope.scaling.{key}" in meta:
            rope[name] = meta[f"rope.scaling.{key}"]
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


def _ff_write(config: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """`feed_forward_length`: the converter writes the experts' width; the graph never reads it."""
    meta["feed_forward_length"] = config["intermediate_size"]


def _ignore(meta: Meta, config: dict[str, Any]) -> None:
    return None


def _layers(tensors: Mapping[str, Any], suffix: str) -> list[int]:
    return sorted({int(n.split(".")[1]) for n in tensors if n.startswith("blk.")
                   and n.endswith(suffix)})  # fmt: skip


def _join(tensors: dict[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    """The experts as transformers' gpt-oss holds them: gate and up interleaved in
    `gate_up_proj (E, d, 2·ff)`, `down_proj (E, ff, d)`."""
    for i in _layers(tensors, ".ffn_gate_exps.weight"):
        at, hf = f"blk.{i}.", _AT.format(i=i)
        names = [f"{at}ffn_{m}_exps.{k}" for m in ("gate", "up") for k in ("weight", "bias")]
        if (
            not all(n in tensors for n in names)
            or tensors[names[0]].shape != tensors[names[2]].shape
            or tensors[names[1]].shape != tensors[names[3]].shape
        ):
            continue  # the family's strict check names what is missing or misshapen
        gate, gate_b, up, up_b = (tensors.pop(n) for n in names)
        rows = torch.stack((gate, up), dim=2).flatten(1, 2)  # (E, 2·ff, d): g0, u0, g1, ...
        tensors[f"{hf}.gate_up_proj"] = rows.transpose(1, 2).contiguous()
        tensors[f"{hf}.gate_up_proj_bias"] = torch.stack((gate_b, up_b), dim=2).flatten(1, 2)
    for i in _layers(tensors, ".ffn_down_exps.weight"):
        down = tensors.pop(f"blk.{i}.ffn_down_exps.weight")
        tensors[f"{_AT.format(i=i)}.down_proj"] = down.transpose(1, 2).contiguous()
        if f"blk.{i}.ffn_down_exps.bias" in tensors:
            tensors[f"{_AT.format(i=i)}.down_proj_bias"] = tensors.pop(
                f"blk.{i}.ffn_down_exps.bias"
            )
    return tensors


def _split(
    tensors: dict[str, Tensor], config: Mapping[str, Any]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The experts as llama.cpp's converter stores them (gate and up de-interleaved)."""
    out: dict[str, Tensor] = {}
    rest = {k: v for k, v in tensors.items() if not k.endswith(_EXPERTS)}
    for name, t in tensors.items():
        if name in rest:
            continue
        i = name.split(".")[2]
        at = f"blk.{i}."
        if name.endswith(".gate_up_proj"):
            rows = t.transpose(1, 2)  # (E, 2·ff, d)
            out[f"{at}ffn_gate_exps.weight"] = rows[:, ::2].contiguous()
            out[f"{at}ffn_up_exps.weight"] = rows[:, 1::2].contiguous()
        elif name.endswith(".gate_up_proj_bias"):
            out[f"{at}ffn_gate_exps.bias"] = t[:, ::2].contiguous()
            out[f"{at}ffn_up_exps.bias"] = t[:, 1::2].contiguous()
        elif name.endswith(".down_proj"):
            out[f"{at}ffn_down_exps.weight"] = t.transpose(1, 2).contiguous()
        else:
            out[f"{at}ffn_down_exps.bias"] = t.contiguous()
    return rest, out


GPT_OSS: Final = Architecture(
    name="gpt-oss",
    family="gpt_oss",
    model_type="gpt_oss",
    fields=(
        ("vocab_size", "vocab_size"),
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("attention.key_length", "head_dim"),
        ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        ("attention.sliding_window", "sliding_window"),
        ("rope.freq_base", "rope_theta"),
        ("expert_count", "num_local_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "intermediate_size"),
    ),
    head_keys=("rope.dimension_count", "attention.value_length"),
    trivial={},
    tensors=(
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        layer("attn_norm.weight", "input_layernorm.weight"),
        layer("post_attention_norm.weight", "post_attention_layernorm.weight"),
        *(
            layer(f"attn_{g}.{p}", f"self_attn.{h}_proj.{p}")
            for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
            for p in ("weight", "bias")
        ),
        layer("attn_sinks.weight", "self_attn.sinks"),
        *(layer(g, f"mlp.{h}") for g, h in both("ffn_gate_inp", "router")),
    ),
    defaults={"rope_theta": 10000.0},
    fixed={"swiglu_alpha": 1.702, "swiglu_limit": 7.0, "attention_bias": True},
    derived=(
        Derived(
            (
                "rope.scaling.type",
                "rope.scaling.factor",
                "rope.scaling.original_context_length",
                "rope.scaling.yarn_beta_fast",
                "rope.scaling.yarn_beta_slow",
            ),
            _rope_read,
            _rope_write,
            (("rope_scaling", "rope.scaling.type"),),
        ),
        Derived(("feed_forward_length",), _ignore, _ff_write),
    ),
    shapes={
        "ffn_gate_inp.bias": ("E",),
        "ffn_gate_exps.bias": ("E", "fe"),
        "ffn_up_exps.bias": ("E", "fe"),
        "ffn_down_exps.bias": ("E", "d"),
    },
    join=_join,
    split=_split,
)
