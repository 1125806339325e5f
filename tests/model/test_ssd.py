"""lmcore.model.ssd: the chunked and the recurrent SSD against the recurrence written out token
by token, head by head in float64, from a given initial state, with chunks that do not divide
the sequence and grouped B, C; their gradients agree; a strong decay underflows instead of
overflowing; and transformers' own torch chunk scan computes the same."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lmcore.model.ssd import chunk_ssd, recurrent_ssd

B, T, H, P, G, N = 2, 13, 4, 3, 2, 5


def inputs(seed: int = 0, decay: float = 1.0, dtype: torch.dtype = torch.float64) -> list[Tensor]:
    """x, dt (> 0), A (< 0), B, C, D and an initial state."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    x = randn(B, T, H, P)
    dt = torch.rand(B, T, H, generator=gen, dtype=dtype) + 0.05
    A = -decay * (torch.rand(H, generator=gen, dtype=dtype) + 0.1)
    return [x, dt, A, randn(B, T, G, N), randn(B, T, G, N), randn(H), randn(B, H, P, N)]


def written_out(
    x: Tensor, dt: Tensor, A: Tensor, b: Tensor, c: Tensor, D: Tensor, h0: Tensor | None
) -> tuple[Tensor, Tensor]:
    """h ← exp(dt·A) h + dt · x ⊗ B;  y = h C + D x, one (batch, head, token) at a time; head
    h reads group h // (H / G)."""
    b_, t_, h_, p_ = x.shape
    per = h_ // b.shape[2]
    y = torch.zeros_like(x)
    final = torch.zeros(b_, h_, p_, b.shape[-1], dtype=x.dtype)
    for i in range(b_):
        for h in range(h_):
            S = torch.zeros(p_, b.shape[-1], dtype=x.dtype) if h0 is None else h0[i, h].clone()
            for t in range(t_):
                g = h // per
                write = dt[i, t, h] * torch.outer(x[i, t, h], b[i, t, g])
                S = torch.exp(dt[i, t, h] * A[h]) * S + write
                y[i, t, h] = S @ c[i, t, g] + D[h] * x[i, t, h]
            final[i, h] = S
    return y, final


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 64])
@pytest.mark.parametrize("initial", [False, True])
def test_chunked_is_the_recurrence_written_out(chunk_size: int, initial: bool) -> None:
    x, dt, A, b, c, D, h0 = inputs()
    h0 = h0 if initial else None
    want_y, want_h = written_out(x, dt, A, b, c, D, h0)
    y, h = chunk_ssd(x, dt, A, b, c, D=D, chunk_size=chunk_size, initial_state=h0)
    torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, want_h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("initial", [False, True])
def test_recurrent_is_the_recurrence_written_out(initial: bool) -> None:
    x, dt, A, b, c, D, h0 = inputs(1)
    h0 = h0 if initial else None
    want_y, want_h = written_out(x, dt, A, b, c, D, h0)
    y, h = recurrent_ssd(x, dt, A, b, c, D=D, initial_state=h0)
    torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, want_h, rtol=1e-12, atol=1e-12)


def test_without_d_there_is_no_skip() -> None:
    x, dt, A, b, c, D, h0 = inputs(6)
    want_y, _ = written_out(x, dt, A, b, c, torch.zeros_like(D), h0)
    for y, _ in (chunk_ssd(x, dt, A, b, c, chunk_size=4, initial_state=h0),
                 recurrent_ssd(x, dt, A, b, c, initial_state=h0)):  # fmt: skip
        torch.testing.assert_close(y, want_y, rtol=1e-12, atol=1e-12)


def test_a_sequence_in_pieces_continues_from_the_state_it_is_given() -> None:
    x, dt, A, b, c, D, h0 = inputs(2)
    whole, h_whole = chunk_ssd(x, dt, A, b, c, D=D, chunk_size=4, initial_state=h0)
    first, h = chunk_ssd(x[:, :6], dt[:, :6], A, b[:, :6], c[:, :6], D=D, chunk_size=4,
                         initial_state=h0)  # fmt: skip
    second, h = recurrent_ssd(x[:, 6:], dt[:, 6:], A, b[:, 6:], c[:, 6:], D=D, initial_state=h)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_whole, rtol=1e-12, atol=1e-12)


def test_chunked_and_recurrent_gradients_agree() -> None:
    """Every input's gradient (A, D and the initial state's too) through a loss on the outputs
    and the final state: the two forms are the same function."""
    grads = []
    weight = torch.randn(B, T, H, P, dtype=torch.float64)
    for form in ("chunked", "recurrent"):
        xs = [t.clone().requires_grad_(True) for t in inputs(3)]
        x, dt, A, b, c, D, h0 = xs
        if form == "chunked":
            y, h = chunk_ssd(x, dt, A, b, c, D=D, chunk_size=4, initial_state=h0)
        else:
            y, h = recurrent_ssd(x, dt, A, b, c, D=D, initial_state=h0)
        ((y * weight).sum() + h.square().sum()).backward()
        grads.append([t.grad for t in xs])
    for name, g1, g2 in zip(("x", "dt", "A", "B", "C", "D", "state"), *grads, strict=True):
        assert g1 is not None and g2 is not None and g1.abs().max() > 0, name
        torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-10, msg=name)


def test_a_strong_decay_underflows_to_forgetting_instead_of_overflowing() -> None:
    """dt·A near -60 per token: over a chunk of 13 tokens the products reach e^-780, far below
    float32's range; every factor is an exp of a difference <= 0, so they become 0, never
    inf."""
    x, dt, A, b, c, D, h0 = inputs(4, dtype=torch.float32)
    A = torch.full_like(A, -60.0)
    dt = torch.ones_like(dt)
    y, h = chunk_ssd(x, dt, A, b, c, D=D, chunk_size=64, initial_state=h0)
    ref_y, ref_h = recurrent_ssd(x, dt, A, b, c, D=D, initial_state=h0)
    assert torch.isfinite(y).all() and torch.isfinite(h).all()
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)


def test_transformers_torch_chunk_scan_computes_the_same() -> None:
    mamba2 = pytest.importorskip(
        "transformers.models.mamba2.modeling_mamba2", reason="transformers"
    )
    x, dt, A, b, c, D, h0 = inputs(5, dtype=torch.float32)
    y, h = chunk_ssd(x, dt, A, b, c, D=D, chunk_size=4, initial_state=h0)
    ref_y, ref_h = mamba2.mamba2_chunk_scan(
        x, dt, A, b, c, chunk_size=4, D=D, initial_states=h0, return_final_states=True
    )
    torch.testing.assert_close(y, ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
