from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmcore_sdpa import SDPA


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("sq,sk", [(5, 5), (2, 6), (1, 4)])
def test_matches_torch_causal_attention_with_grouped_heads(heads, kv_heads, sq, sk) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, heads, sq, 8)
    k, v = torch.randn(2, kv_heads, sk, 8), torch.randn(2, kv_heads, sk, 8)
    out = SDPA()(q, k, v, causal=True)
    # torch's is_causal aligns to the start for Sq != Sk; build the end-aligned mask explicitly.
    mask = torch.ones(sq, sk, dtype=torch.bool).tril(diagonal=sk - sq)
    group = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask
    )
    torch.testing.assert_close(out, expected)


def test_bias_per_head_and_mask_combine_with_causal() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    bias = torch.randn(4, 5, 5)
    mask = torch.rand(1, 1, 5, 5) > 0.2
    mask[..., 0] = True
    out = SDPA()(q, k, v, causal=True, mask=mask, bias=bias)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 8**0.5 + bias
    scores = scores.masked_fill(~(mask & causal), float("-inf"))
    expected = torch.softmax(scores, -1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(out, expected)


def test_not_causal_attends_to_every_key() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    torch.testing.assert_close(
        SDPA()(q, k, v, causal=False), F.scaled_dot_product_attention(q, k, v)
    )
