"""GPT-2 (`GPT2LMHeadModel`, model_type `gpt2`): pre-norm blocks of LayerNorm, learned absolute
positions (`pos=learned`), biases on every projection, a GELU MLP in its tanh form (`gelu_new`)
and tied embeddings. Its `Conv1D` layers store weights as (in, out), a linear layer's
transposed, and `c_attn` holds q, k and v one after another: split, transposed and fused again.

    config.json                                    spec
    vocab_size, n_embd, n_layer, n_head           vocab_size, d_model, num_layers, num_heads
    n_positions, n_inner (null: 4 · n_embd)       context_length, d_ff
    layer_norm_epsilon                             norm=layernorm(eps=...)
    activation_function                            ffn=gelu(bias=true, approximate=tanh), ...
    scale_attn_weights,
      scale_attn_by_inverse_layer_idx              query_scale (per layer: / (i + 1))
    tie_word_embeddings                            tie_embeddings

`reorder_and_upcast_attn` computes the same scores in float32 (kept, not applied: lmcore's
attention is as exact); the `summary_*` fields configure a classification head (kept).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from lmcore.hf.common import UNGATED, ends
from lmcore.hf.family import Family
from lmcore.hf.rules import Choice, Draft, Dropout, Field, SpecView, checked
from lmcore.hf.weights import TRANSPOSE, Fused, weight
from lmcore.spec import MAX_LAYERED, default_query_scale


@dataclass(frozen=True)
class AttentionScale:
    """`scale_attn_weights` (q·k / sqrt(head_dim), or not scaled) and
    `scale_attn_by_inverse_layer_idx` (also / (layer + 1)) to per-layer `query_scale`."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("scale_attn_weights", "scale_attn_by_inverse_layer_idx")

    @staticmethod
    def scales(head_dim: int, n: int, weights: bool, inverse: bool) -> list[float]:
        base = default_query_scale(head_dim) if weights else 1.0
        return [base / (i + 1) if inverse else base for i in range(n)]

    def read(self, d: Draft) -> None:
        weights = checked(
            "scale_attn_weights", d.field("scale_attn_weights", True), bool, d.problems
        )
        inverse = checked(
            "scale_attn_by_inverse_layer_idx",
            d.field("scale_attn_by_inverse_layer_idx", False),
            bool,
            d.problems,
        )
        width, heads, n = d.values.get("d_model"), d.values.get("num_heads"), d.num_layers
        if None in (weights, inverse, width, heads, n):
            return
        assert isinstance(width, int) and isinstance(heads, int) and n is not None
        if not inverse:  # one scale for every layer: nothing done per layer
            base = default_query_scale(width // heads) if weights else 1.0
            d.set("query_scale", base, "scale_attn_weights")
        elif n > MAX_LAYERED:  # a scale per layer, more than a spec lists
            d.problems.append(
                f"scale_attn_by_inverse_layer_idx=true scales each of its {n:,} layers "
                f"differently: lmcore's spec gives per-layer values to at most {MAX_LAYERED:,} "
                "layers"
            )
        else:
            scales = self.scales(width // heads, n, bool(weights), bool(inverse))
            d.set("query_scale", scales, "scale_attn_weights")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        given = v.layers("query_scale")
        for weights, inverse in ((True, False), (False, False), (True, True), (False, True)):
            if given == self.scales(v.spec.head_dim, v.n, weights, inverse):
                break
        else:
            weights, inverse = True, False  # what differs is named by the read-back
        out["scale_attn_weights"], out["scale_attn_by_inverse_layer_idx"] = weights, inverse


def _four_times(d: Draft) -> Any:
    width = d.values.get("d_model")
    return None if width is None else 4 * width


DEFAULTS: Final = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "layer_norm_epsilon": 1e-5,
}
H: Final = "transformer.h.{i}"
FAMILY: Final = Family(
    model_type="gpt2",
    architecture="GPT2LMHeadModel",
    spec={
        "block": "prenorm",
        "norm": "layernorm",
        "ffn.bias": True,
        "pos": "learned",
        "attn": "sdpa",
        "qkv_bias": True,
        "out_bias": True,
    },
    rules=(
        Field("vocab_size", "vocab_size", int, 50257),
        Field("n_embd", "d_model", int, 768, aliases=("hidden_size",)),
        Field("n_layer", "num_layers", int, 12, aliases=("num_hidden_layers",)),
        Field("n_head", "num_heads", int, 12, aliases=("num_attention_heads",)),
        Field("n_positions", "context_length", int, 1024, aliases=("max_position_embeddings",)),
        Field("n_inner", "d_ff", int, _four_times),
        Field("layer_norm_epsilon", "norm.eps", float, 1e-5),
        Field("tie_word_embeddings", "tie_embeddings", bool, True),
        Choice("activation_function", UNGATED, "gelu_new", what="an MLP's activation"),
        AttentionScale(),
        Dropout(("attn_pdrop", "embd_pdrop", "resid_pdrop")),
    ),
    tensors=(
        *ends("transformer.wte.weight", "transformer.ln_f"),
        weight("pos.weight", "transformer.wpe.weight"),
        *(
            weight(f"layers.{{i}}.{ours}.{p}", f"{H}.{theirs}.{p}")
            for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2"))
            for p in ("weight", "bias")
        ),
        *(
            weight(
                tuple(f"layers.{{i}}.attn.{x}_proj.{p}" for x in "qkv"),
                f"{H}.attn.c_attn.{p}",
                Fused((False, False, False), transpose=True),
            )
            for p in ("weight", "bias")
        ),
        weight("layers.{i}.attn.output_proj.weight", f"{H}.attn.c_proj.weight", TRANSPOSE),
        weight("layers.{i}.attn.output_proj.bias", f"{H}.attn.c_proj.bias"),
        weight("layers.{i}.ffn.w1.weight", f"{H}.mlp.c_fc.weight", TRANSPOSE),
        weight("layers.{i}.ffn.w1.bias", f"{H}.mlp.c_fc.bias"),
        weight("layers.{i}.ffn.w2.weight", f"{H}.mlp.c_proj.weight", TRANSPOSE),
        weight("layers.{i}.ffn.w2.bias", f"{H}.mlp.c_proj.bias"),
    ),
    embedding="transformer.wte.weight",
    prefix="transformer.",
    skip=(".attn.bias", ".attn.masked_bias"),
    passive=frozenset(
        {
            "n_ctx",
            "reorder_and_upcast_attn",
            "summary_type",
            "summary_use_proj",
            "summary_activation",
            "summary_proj_to_labels",
            "summary_first_dropout",
        }
    ),
)
