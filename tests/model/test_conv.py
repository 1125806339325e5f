"""The causal depthwise convolution against torch's conv1d, and its tail against one long call."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lmcore.model.conv import causal_conv


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    C, K = weight.shape
    y = F.conv1d(x.transpose(1, 2), weight[:, None, :], bias, padding=K - 1, groups=C)
    return y[..., : x.shape[1]].transpose(1, 2)


def test_matches_conv1d_with_and_without_bias() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 11, 6, dtype=torch.float64)
    for K in (2, 3, 4):
        w = torch.randn(6, K, dtype=torch.float64)
        for bias in (None, torch.randn(6, dtype=torch.float64)):
            y, tail = causal_conv(x, w, bias)
            torch.testing.assert_close(y, _reference(x, w, bias), rtol=1e-12, atol=1e-12)
            assert torch.equal(tail, x[:, -(K - 1) :].transpose(1, 2))


def test_the_tail_continues_a_sequence_in_pieces() -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 9, 5)
    w, b = torch.randn(5, 4), torch.randn(5)
    whole, _ = causal_conv(x, w, b)
    tail, pieces = None, []
    for lo, hi in ((0, 4), (4, 5), (5, 6), (6, 9)):
        y, tail = causal_conv(x[:, lo:hi], w, b, tail)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, rtol=1e-6, atol=1e-6)
    assert tail is not None and torch.equal(tail, x[:, -3:].transpose(1, 2))


def test_a_single_token_shorter_than_the_kernel() -> None:
    x = torch.ones(1, 1, 2)
    y, tail = causal_conv(x, torch.ones(2, 4))
    assert torch.equal(y, torch.ones(1, 1, 2))  # three zeros before it
    assert tail.shape == (1, 2, 3) and torch.equal(tail[..., -1], torch.ones(1, 2))
