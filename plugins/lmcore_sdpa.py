"""attn=sdpa: exact scaled dot-product attention, CS336 §3.5.4, with grouped-query heads."""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from lmcore import Component, hookimpl
from lmcore.nn import causal_mask, group_heads, kv_heads_kept, scaled_dot_product_attention


class SDPA(nn.Module):
    """`softmax(q kᵀ / sqrt(D) + bias) v`, materialising the `(Sq, Sk)` scores.

    Grouped-query attention without repeating k and v: the H query heads are viewed as
    `(Hkv, H / Hkv)` groups that broadcast against the Hkv key/value heads. (torch's
    broadcasting matmul still expands k and v into a copy per call, and autograd keeps it.)
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
    ) -> Float[Tensor, "B H Sq D"]:
        *batch, heads, sq, d = q.shape
        kv_heads, sk = k.shape[-3], k.shape[-2]
        if causal:
            keep = causal_mask(sq, sk, device=q.device)  # (Sq, Sk)
            mask = keep if mask is None else mask & keep
        if kv_heads == heads:
            return scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
        group = heads // kv_heads
        qg = q.reshape(*batch, kv_heads, group, sq, d)  # (B, Hkv, G, Sq, D)
        kg, vg = k.unsqueeze(-3), v.unsqueeze(-3)  # (B, Hkv, 1, Sk, D)
        out = scaled_dot_product_attention(
            qg,
            kg,
            vg,
            mask=group_heads(mask, kv_heads, group),
            bias=group_heads(bias, kv_heads, group),
        )
        return out.reshape(*batch, heads, sq, d)


def sdpa_activations(
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    kv_len: int,
    dtype: torch.dtype,
) -> int:
    """Bytes kept for backward: q / sqrt(D); k and v with H heads; the softmax numerator
    (B, H, Sq, Sk); the unnormalised output (B, H, Sq, D), the denominator and its zero test
    (B, H, Sq); and the inverted causal mask (Sq, Sk) as bool.

    With grouped-query heads, k and v still count H heads (see `kv_heads_kept`).
    """
    rows = batch * num_heads * seq_len  # query rows over all heads
    kv = 2 * batch * kv_heads_kept(batch, num_heads, num_kv_heads) * kv_len * head_dim
    floats = 2 * rows * head_dim + kv + rows * kv_len + rows
    return dtype.itemsize * floats + seq_len * kv_len + rows  # + the two bool tensors


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="attn",
            name="sdpa",
            build=SDPA,
            help="exact attention; memory grows with Sq·Sk",
            # q kᵀ and (scores) v: two (Sq × D) by (D × Sk)-sized matmuls per query head.
            flops=lambda num_heads, head_dim, seq_len, kv_len: (
                4 * num_heads * seq_len * kv_len * head_dim
            ),
            activations=sdpa_activations,
            features=frozenset({"gqa", "bias", "mask", "compile"}),
        )
    ]
