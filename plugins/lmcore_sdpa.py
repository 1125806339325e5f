"""attn=sdpa: exact scaled dot-product attention, CS336 §3.5.4, with grouped-query heads, and the
query scale, soft-capped scores, a sliding window and attention sinks when a spec asks for them."""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from lmcore import Component, hookimpl
from lmcore.model.attention import Plan, accumulator, kept_elements, tiled_attention
from lmcore.model.documents import same_document


class SDPA(nn.Module):
    """`softmax(q kᵀ / sqrt(D) + bias) v`, keeping the softmax weights for backward.

    Computed by `lmcore.model.attention.tiled_attention` one block of queries at a time (so each
    pass over the scores stays in cache) against the keys they may see: a causal model computes and
    keeps the triangle of the `(Sq, Sk)` scores, not the square. Grouped-query heads attend
    their key/value head without a copy of k and v.
    """

    def forward(
        self,
        q: Float[Tensor, "B H Sq D"],
        k: Float[Tensor, "B Hkv Sk D"],
        v: Float[Tensor, "B Hkv Sk D"],
        *,
        causal: bool,
        mask: Bool[Tensor, "... Sq Sk"] | None = None,
        bias: Float[Tensor, "... Sq Sk"] | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        window: int | None = None,
        sinks: Float[Tensor, " H"] | None = None,
        documents: Int[Tensor, "B Sk"] | None = None,
    ) -> Float[Tensor, "B H Sq D"]:
        if documents is not None:  # the dense block-causal mask: every tile is computed
            same = same_document(documents, q.shape[2])
            mask = same if mask is None else mask & same
        return tiled_attention(
            q, k, v, causal=causal, mask=mask, bias=bias, scale=scale, softcap=softcap,
            window=window, sinks=sinks,
        )  # fmt: skip


def sdpa_activations(
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    kv_len: int,
    dtype: torch.dtype,
    window: int = 0,
    attn_sinks: bool = False,
) -> int:
    """Bytes kept for backward (the model calls the kernel causal): q, k, v and the output in
    the model dtype; each row's softmax denominator (and, with sinks, the sink's weight) and
    the softmax numerators of every tile (queries times the keys they may see, within the
    window) in float32 (float64 for float64)."""
    plan = Plan(batch, num_heads, num_kv_heads, seq_len, kv_len, head_dim, True, 0, window)
    tensors = 2 * batch * (num_heads * seq_len + num_kv_heads * kv_len) * head_dim
    rows = batch * num_heads * seq_len
    stats = rows * (2 if attn_sinks else 1) + kept_elements(plan)
    return dtype.itemsize * tensors + accumulator(dtype).itemsize * stats


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="attn",
            name="sdpa",
            build=SDPA,
            help="exact attention; memory grows with Sq·Sk",
            # q kᵀ and (scores) v: two (Sq × D) by (D × Sk)-sized matmuls per query head,
            # counted over the whole score matrix as torch counts its fused attention.
            flops=lambda num_heads, head_dim, seq_len, kv_len: (
                4 * num_heads * seq_len * kv_len * head_dim
            ),
            activations=sdpa_activations,
            features=frozenset({"gqa", "bias", "mask", "scale", "softcap", "window", "sinks",
                                "documents", "compile"}),
        )
    ]
