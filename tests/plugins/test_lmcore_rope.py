from __future__ import annotations

import pytest
import torch

from lmcore_rope import RotaryPositionalEmbedding


def _complex_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as complex multiplication of interleaved pairs: an independent formula."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[..., None] * freqs  # (..., seq, d/2)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    rotated = pairs * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(rotated).reshape(x.shape).to(x.dtype)


def test_rope_matches_complex_rotation_of_interleaved_pairs() -> None:
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=16, max_seq_len=32)
    x = torch.randn(2, 4, 10, 16)
    positions = torch.randint(0, 32, (10,))
    torch.testing.assert_close(rope(x, positions), _complex_reference(x, positions, 10000.0))


def test_pair_zero_rotates_by_the_position_itself() -> None:
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=4, max_seq_len=8)
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    out = rope(x, torch.tensor([3]))
    # The first pair's frequency is theta^0 = 1: angle 3 rad. Interleaved, not split halves.
    torch.testing.assert_close(
        out, torch.tensor([[torch.cos(torch.tensor(3.0)), torch.sin(torch.tensor(3.0)), 0.0, 0.0]])
    )


def test_rope_preserves_norms() -> None:
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=500.0, d_k=32, max_seq_len=64)
    x = torch.randn(3, 64, 32)
    out = rope(x, torch.arange(64))
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("shift", [1, 7, 20])
def test_q_dot_k_depends_only_on_the_relative_position(shift: int) -> None:
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=16, max_seq_len=64)
    q, k = torch.randn(16), torch.randn(16)
    for m, n in [(5, 2), (9, 9), (3, 11)]:
        a = rope(q[None], torch.tensor([m])) @ rope(k[None], torch.tensor([n])).T
        b = rope(q[None], torch.tensor([m + shift])) @ rope(k[None], torch.tensor([n + shift])).T
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_rotation_hook_matches_forward_and_broadcasts_over_heads() -> None:
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16)
    x = torch.randn(2, 3, 5, 8)  # (B, H, T, D)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])  # (B, T)
    rotate = rope.rotation(positions)
    for h in range(3):
        torch.testing.assert_close(rotate(x)[:, h], rope(x[:, h], positions))


def test_tables_are_non_persistent_buffers() -> None:
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16)
    assert rope.state_dict() == {}
    assert {n for n, _ in rope.named_buffers()} == {"cos", "sin"}


def test_bf16_input_keeps_its_dtype() -> None:
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16)
    x = torch.randn(4, 8).to(torch.bfloat16)
    out = rope(x, torch.arange(4))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), _complex_reference(x.float(), torch.arange(4), 10000.0), atol=2e-2, rtol=2e-2
    )


def test_odd_dimension_is_refused() -> None:
    with pytest.raises(ValueError, match=r"RoPE rotates pairs of dimensions; d_k=7 is odd"):
        RotaryPositionalEmbedding(theta=10000.0, d_k=7, max_seq_len=4)


def test_gradients_match_the_complex_reference() -> None:
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    grad = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    (got,) = torch.autograd.grad(rope.rotation(positions)(x), x, grad)
    expected = torch.stack(
        [_complex_reference(x[:, h], positions, 10000.0) for h in range(3)], dim=1
    )
    (want,) = torch.autograd.grad(expected, x, grad)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # float32 tables


def test_strided_and_offset_views_rotate_like_contiguous_tensors() -> None:
    """q and k are (B, H, T, D) views of the (B, T, H·D) projections; a view may also start at
    an odd element, which complex views cannot (the rotation copies it first)."""
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16)
    proj = torch.randn(2, 5, 3 * 8 + 1)
    positions = torch.arange(5)[None]
    rotate = rope.rotation(positions)
    for start in (0, 1):
        x = proj[..., start : start + 24].view(2, 5, 3, 8).transpose(1, 2)
        torch.testing.assert_close(rotate(x), rotate(x.contiguous()))


def test_compiled_rotation_matches_eager() -> None:
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.arange(5)[None]
    compiled = torch.compile(lambda x: rope.rotation(positions)(x), backend="aot_eager")
    torch.testing.assert_close(compiled(x), rope.rotation(positions)(x))


@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_a_rotation_made_eagerly_traces_whole_when_applied_under_compile(rotary_dim: int) -> None:
    """compile_decoding's regional mode gathers the rotation eagerly (once per step) and
    applies it in each compiled layer: it must trace there without a graph break (fullgraph),
    in its real form, and give the eager rotation."""
    torch.manual_seed(0)
    rope = RotaryPositionalEmbedding(theta=10000.0, d_k=8, max_seq_len=16, rotary_dim=rotary_dim)
    x = torch.randn(2, 3, 5, 8)
    rotate = rope.rotation(torch.arange(5)[None])  # made outside the compiled code
    compiled = torch.compile(lambda x: rotate(x), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), rotate(x))
