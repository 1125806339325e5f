"""attn=chunked: exact attention with an online softmax over key blocks (Milakov & Gimelshein,
2018; the FlashAttention recurrence), linear in memory for training as for inference.

Each block of queries walks its keys `block_size` at a time: the running row max, softmax
denominator and output are rescaled by `exp(old_max - new_max)` and the block's weights
`exp(s - new_max)` are added in. Only the output and each row's log-sum-exp are kept for
backward, which recomputes every key block's weights (Dao et al., 2022): memory grows linearly
with the sequence length, at the price of one more `q kᵀ` per block in the backward.
`lmcore.model.attention.tiled_attention` does both, in plain torch.

Attention sinks start each row's running max and sum (a key with no value), so the recurrence
stays exact; the backward takes the sink's weight from the row's log-sum-exp.

A query row whose keys are all masked returns zeros, as `sdpa` and torch's fused kernel do: the
row has nothing to attend to, and zeros keep NaN out of the residual stream and the gradients,
e.g. for left-padded batches.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.model.attention import accumulator, tiled_attention


class ChunkedAttention(nn.Module):
    """`softmax(q kᵀ / sqrt(D) + bias) v`, streamed over key blocks; softmax state in float32.

    Grouped-query heads attend their key/value head without a copy of k and v. Causal queries
    are aligned to the end of the keys, and key blocks wholly ahead of a query block are skipped.
    With `documents` (the keys' document ids) a query sees only its own document's keys, and
    the key blocks wholly before a query block's first document are skipped too.
    """

    def __init__(self, block_size: int = 128):
        super().__init__()
        if block_size < 1:
            raise ValueError(
                f"block_size must be >= 1, got {block_size}; the default is 128 keys per block"
            )
        self.block_size = block_size

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
        return tiled_attention(
            q, k, v, causal=causal, mask=mask, bias=bias, key_block=self.block_size,
            scale=scale, softcap=softcap, window=window, sinks=sinks, documents=documents,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"


def chunked_activations(
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    kv_len: int,
    dtype: torch.dtype,
) -> int:
    """Bytes kept for backward, linear in the sequence length: q, k, v and the output in the
    model dtype, and each row's log-sum-exp in float32 (float64 for float64)."""
    tensors = 2 * batch * (num_heads * seq_len + num_kv_heads * kv_len) * head_dim
    return dtype.itemsize * tensors + accumulator(dtype).itemsize * batch * num_heads * seq_len


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="attn",
            name="chunked",
            build=ChunkedAttention,
            args=(Arg("block_size", int, 128, "keys per block of the online softmax", ge=1),),
            help="exact attention, online softmax over key blocks; memory linear in Sq",
            # q kᵀ and p v: the same matmul work as sdpa, counted over the whole score matrix
            # as torch counts its fused attention.
            flops=lambda num_heads, head_dim, seq_len, kv_len: (
                4 * num_heads * seq_len * kv_len * head_dim
            ),
            activations=chunked_activations,
            features=frozenset({"gqa", "bias", "mask", "scale", "softcap", "window", "sinks",
                                "documents", "compile"}),
        )
    ]
