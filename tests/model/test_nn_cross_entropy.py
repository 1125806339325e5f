"""`lmcore.model.nn.cross_entropy`: torch's numbers, large logits, float32 out of bfloat16."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmcore.model.nn import cross_entropy


def test_cross_entropy_matches_torch_and_survives_large_logits() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    expected = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets), expected)
    torch.testing.assert_close(cross_entropy(logits * 1000 + 100, targets), F.cross_entropy(
        (logits * 1000 + 100).reshape(-1, 11), targets.reshape(-1)
    ))  # fmt: skip
    bf16 = cross_entropy(logits.bfloat16(), targets)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, expected, atol=0.05, rtol=0.0)
