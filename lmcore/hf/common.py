"""What the family tables share: the config fields of a decoder (sizes, heads, context, tied
embeddings), the activation tables, and the tensor rows of the Llama-style layout most families
keep (`model.layers.{i}.self_attn.q_proj.weight`, ...). Each family module composes its table
from these and its own rows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from lmcore.hf.rules import Draft, Field, Rule
from lmcore.hf.weights import COPY, ROTARY, Layout, Weight, weight

__all__ = ["GATED", "UNGATED", "attention", "core", "ends", "mlp", "norms"]


def _heads(d: Draft) -> Any:
    return d.values.get("num_heads")


def _per_head(d: Draft) -> Any:
    """`hidden_size // num_attention_heads`, as transformers derives an absent head_dim."""
    width, heads = d.values.get("d_model"), d.values.get("num_heads")
    return None if width is None or heads is None else width // heads


def core(
    defaults: Mapping[str, Any],
    *,
    head_dim: bool = True,
    d_ff: bool = True,
    eps: str | None = "rms_norm_eps",
    qk_norm: bool = False,
) -> tuple[Rule, ...]:
    """The sizes every decoder's config gives, with the family's own defaults (transformers'
    class defaults: what a config.json without the field means). `num_key_value_heads` null
    is the heads; an absent or null `head_dim` is `hidden_size // num_attention_heads` unless
    the family's class sets one (Gemma's 256). `eps`: the norm's epsilon field, also the q/k
    norms' with `qk_norm`."""
    kv = defaults.get("num_key_value_heads", _heads)
    rules: list[Rule] = [
        Field("vocab_size", "vocab_size", int, defaults["vocab_size"]),
        Field("hidden_size", "d_model", int, defaults["hidden_size"]),
        Field("num_hidden_layers", "num_layers", int, defaults["num_hidden_layers"]),
        Field("num_attention_heads", "num_heads", int, defaults["num_attention_heads"]),
        Field("num_key_value_heads", "num_kv_heads", int, kv, null=_heads),
    ]
    if head_dim:
        rules.append(
            Field("head_dim", "head_dim", int, defaults.get("head_dim", _per_head), null=_per_head)
        )
    if d_ff:
        rules.append(Field("intermediate_size", "d_ff", int, defaults["intermediate_size"]))
    rules += [
        Field(
            "max_position_embeddings", "context_length", int, defaults["max_position_embeddings"]
        ),
        Field("tie_word_embeddings", "tie_embeddings", bool, defaults["tie_word_embeddings"]),
    ]
    if eps is not None:
        paths = ("norm.eps", "qk_norm.eps") if qk_norm else "norm.eps"
        rules.append(Field(eps, paths, float, defaults[eps]))
    return tuple(rules)


# Activation functions (transformers' ACT2FN names) and lmcore's feed-forward rows: gated (a
# Llama-style MLP, act(gate) * up) and ungated (GPT-2, GPT-NeoX). Only names whose function
# lmcore computes exactly are listed.
GATED: Final[Mapping[str, Mapping[str, Any]]] = {
    "silu": {"ffn": "swiglu"},
    "swish": {"ffn": "swiglu"},
    "gelu": {"ffn": "geglu", "ffn.approximate": "none"},
    "gelu_pytorch_tanh": {"ffn": "geglu", "ffn.approximate": "tanh"},
    "gelu_new": {"ffn": "geglu", "ffn.approximate": "tanh"},
}
UNGATED: Final[Mapping[str, Mapping[str, Any]]] = {
    "gelu": {"ffn": "gelu", "ffn.approximate": "none"},
    "gelu_new": {"ffn": "gelu", "ffn.approximate": "tanh"},
    "gelu_pytorch_tanh": {"ffn": "gelu", "ffn.approximate": "tanh"},
    "relu": {"ffn": "relu"},
    "silu": {"ffn": "silu"},
    "swish": {"ffn": "silu"},
}


def _both(ours: str, theirs: str, layout: Layout = COPY) -> tuple[Weight, ...]:
    """A linear layer's weight and bias (the bias row applies when the model has one)."""
    return (
        weight(f"{ours}.weight", f"{theirs}.weight", layout),
        weight(f"{ours}.bias", f"{theirs}.bias", layout),
    )


def ends(
    embedding: str = "model.embed_tokens.weight",
    final: str = "model.norm",
    head: str = "lm_head.weight",
) -> tuple[Weight, ...]:
    """The token embeddings, the final norm (weight, and bias for a LayerNorm) and the head."""
    return (
        weight("token_embeddings.weight", embedding),
        *_both("ln_final", final),
        weight("lm_head.weight", head),
    )


def norms(names: Mapping[str, str], layer: str = "model.layers.{i}") -> tuple[Weight, ...]:
    """A layer's norms: lmcore's block attribute (`ln1`, `ln1_out`, ...) to the name there."""
    return tuple(
        w
        for ours, theirs in names.items()
        for w in _both(f"layers.{{i}}.{ours}", f"{layer}.{theirs}")
    )


def attention(at: str = "model.layers.{i}.self_attn", out: str = "o_proj") -> tuple[Weight, ...]:
    """q, k, v and the output projection under their own names (q and k rows permuted), and
    the q/k norms."""
    ours = "layers.{i}.attn"
    return (
        *_both(f"{ours}.q_proj", f"{at}.q_proj", ROTARY),
        *_both(f"{ours}.k_proj", f"{at}.k_proj", ROTARY),
        *_both(f"{ours}.v_proj", f"{at}.v_proj"),
        *_both(f"{ours}.output_proj", f"{at}.{out}"),
        weight(f"{ours}.q_norm.weight", f"{at}.q_norm.weight", ROTARY),
        weight(f"{ours}.k_norm.weight", f"{at}.k_norm.weight", ROTARY),
    )


def mlp(
    at: str = "model.layers.{i}.mlp",
    ours: str = "layers.{i}.ffn",
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> tuple[Weight, ...]:
    """A gated MLP: w1 = gate, w3 = up, w2 = down (and their biases)."""
    gate, up, down = names
    return (
        *_both(f"{ours}.w1", f"{at}.{gate}"),
        *_both(f"{ours}.w3", f"{at}.{up}"),
        *_both(f"{ours}.w2", f"{at}.{down}"),
    )
