"""attn=chunked: exact attention with an online softmax over key blocks (Milakov & Gimelshein,
2018; the FlashAttention recurrence), so memory grows linearly with sequence length.

For each block of `block_size` keys the scores `(Sq, block)` are formed; the running row max,
softmax denominator and output accumulator are rescaled by `exp(old_max - new_max)`, and the
block's weights `exp(s - new_max)` are added in. Only one block of scores exists at a time.

A query row whose keys are all masked returns zeros, as `sdpa` and torch's fused kernel do: the
row has nothing to attend to, and zeros keep NaN out of the residual stream and the gradients,
e.g. for left-padded batches.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.nn import group_heads, kv_heads_kept


class ChunkedAttention(nn.Module):
    """`softmax(q kᵀ / sqrt(D) + bias) v`, streamed over key blocks; softmax state in float32.

    Grouped-query heads without repeating k, v: q is viewed as `(B, Hkv, G, Sq, D)` against
    `(B, Hkv, 1, block, D)` key blocks (torch's broadcasting matmul still expands each block).
    Causal queries are aligned to the end of the keys.
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
    ) -> Float[Tensor, "B H Sq D"]:
        *batch, heads, sq, d = q.shape
        kv_heads, sk = k.shape[-3], k.shape[-2]
        group = heads // kv_heads
        acc_dtype = torch.promote_types(q.dtype, torch.float32)  # bf16 sums lose too much
        # Contiguous once, up front: a head-strided q, k or v (a view of the (B, T, H·D)
        # projections) would make every block's matmul copy its operands again.
        qg = (q.reshape(*batch, kv_heads, group, sq, d) * (1.0 / math.sqrt(d))).contiguous()
        k, v = k.contiguous(), v.contiguous()  # (B, Hkv, Sk, D)
        mask, bias = group_heads(mask, kv_heads, group), group_heads(bias, kv_heads, group)
        q_pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)  # (Sq, 1), end-aligned

        # Running row max, softmax denominator and unnormalised output, all in float32.
        row_max = torch.full((*qg.shape[:-1], 1), -math.inf, device=q.device, dtype=acc_dtype)
        row_sum = torch.zeros_like(row_max)  # (B, Hkv, G, Sq, 1)
        acc = torch.zeros(qg.shape, device=q.device, dtype=acc_dtype)  # (B, Hkv, G, Sq, D)
        for start in range(0, sk, self.block_size):
            end = min(start + self.block_size, sk)
            kb, vb = k[..., None, start:end, :], v[..., None, start:end, :]  # (B,Hkv,1,blk,D)
            s = (qg @ kb.transpose(-2, -1)).to(acc_dtype)  # (B, Hkv, G, Sq, blk)
            if bias is not None:
                s = s + _keys(bias, start, end)
            keep = None if mask is None else _keys(mask, start, end)
            if causal:
                ahead = torch.arange(start, end, device=q.device)[None, :] <= q_pos  # (Sq, blk)
                keep = ahead if keep is None else keep & ahead
            if keep is not None:
                s = s.masked_fill(~keep, -math.inf)
            new_max = torch.maximum(row_max, s.amax(dim=-1, keepdim=True))
            # A row with no key seen yet keeps max -inf; shift it by 0 so exp gives 0, not NaN.
            shift = torch.where(new_max == -math.inf, 0.0, new_max)
            p = torch.exp(s - shift)  # (B, Hkv, G, Sq, blk)
            rescale = torch.exp(row_max - shift)  # for what earlier blocks accumulated
            row_sum = row_sum * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + (p.to(v.dtype) @ vb).to(acc_dtype)
            row_max = new_max
        # Fully masked rows have row_sum = 0 and acc = 0: divide by 1 there to return zeros.
        out = acc / torch.where(row_sum == 0, 1.0, row_sum)
        return out.to(q.dtype).reshape(*batch, heads, sq, d)

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"


def _keys(t: Tensor, start: int, end: int) -> Tensor:
    """Columns `start:end` of a mask or bias; a size-1 key dimension broadcasts as it is."""
    return t if t.shape[-1] == 1 else t[..., start:end]


def chunked_activations(
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    kv_len: int,
    dtype: torch.dtype,
    block_size: int,
) -> int:
    """Bytes kept for backward. Once: q / sqrt(D), k and v (H heads' worth for grouped heads,
    see `kv_heads_kept`), and the float32 output and denominator. Per key block of
    b keys: the mask (Sq, b) as bool; the float32 scores and weights (B, H, Sq, b), and the
    weights in the model dtype when that is not float32; the row max, previous max, rescale
    factor and previous sum (B, H, Sq) in float32, a bool zero test, and the previous output
    accumulator (B, H, Sq, D) in float32."""
    rows = batch * num_heads * seq_len  # query rows over all heads
    size = dtype.itemsize
    blocks = -(-kv_len // block_size)
    kv_heads = kv_heads_kept(batch, num_heads, num_kv_heads)
    once = size * (rows * head_dim + 2 * batch * kv_heads * kv_len * head_dim)
    once += rows * (4 * head_dim + 4 + 1)  # output accumulator, denominator, its zero test
    keys = seq_len * kv_len + rows * kv_len * (8 + (size if dtype != torch.float32 else 0))
    return once + keys + blocks * rows * (4 * head_dim + 4 * 4 + 1)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="attn",
            name="chunked",
            build=ChunkedAttention,
            args=(Arg("block_size", int, 128, "keys per block of the online softmax", ge=1),),
            help="exact attention, online softmax over key blocks; memory grows with Sq·block",
            # q kᵀ and p v over all key blocks: the same matmul work as sdpa.
            flops=lambda num_heads, head_dim, seq_len, kv_len: (
                4 * num_heads * seq_len * kv_len * head_dim
            ),
            activations=chunked_activations,
            features=frozenset({"gqa", "bias", "mask", "compile"}),
        )
    ]
