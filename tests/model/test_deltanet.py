"""lmcore.model.deltanet: the chunked and the recurrent gated delta rule against the rule written
out token by token and head by head in float64, from a given initial state, with chunks that do
not divide the sequence; their gradients agree; a strong decay underflows instead of
overflowing; and transformers' own torch implementation computes the same."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lmcore.model.deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule

B, T, H, DK, DV = 2, 13, 3, 5, 4


def inputs(seed: int = 0, decay: float = 1.0, dtype: torch.dtype = torch.float64) -> list[Tensor]:
    """q, k, v, g, β and an initial state; k of unit norm as the layer gives it."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    q, k, v = randn(B, T, H, DK), randn(B, T, H, DK), randn(B, T, H, DV)
    k = k / k.norm(dim=-1, keepdim=True)
    g = -decay * torch.rand(B, T, H, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    return [q, k, v, g, beta, randn(B, H, DK, DV)]


def written_out(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S0: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """S ← e^g S;  S ← S + β k (v − Sᵀk)ᵀ;  o = Sᵀ (scale q), one (batch, head, token) at a time."""
    b_, t_, h_, dk = k.shape
    out = torch.zeros(b_, t_, h_, v.shape[-1], dtype=q.dtype)
    final = torch.zeros(b_, h_, dk, v.shape[-1], dtype=q.dtype)
    for b in range(b_):
        for h in range(h_):
            S = torch.zeros(dk, v.shape[-1], dtype=q.dtype) if S0 is None else S0[b, h].clone()
            for t in range(t_):
                S = torch.exp(g[b, t, h]) * S
                error = v[b, t, h] - S.T @ k[b, t, h]
                S = S + beta[b, t, h] * torch.outer(k[b, t, h], error)
                out[b, t, h] = S.T @ (scale * q[b, t, h])
            final[b, h] = S
    return out, final


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 13, 64])
@pytest.mark.parametrize("initial", [False, True])
def test_chunked_is_the_rule_written_out(chunk_size: int, initial: bool) -> None:
    q, k, v, g, beta, S0 = inputs()
    S0 = S0 if initial else None
    want_o, want_S = written_out(q, k, v, g, beta, S0, DK**-0.5)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk_size, initial_state=S0)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, want_S, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("initial", [False, True])
def test_recurrent_is_the_rule_written_out(initial: bool) -> None:
    q, k, v, g, beta, S0 = inputs(1)
    S0 = S0 if initial else None
    want_o, want_S = written_out(q, k, v, g, beta, S0, 0.5)
    o, S = recurrent_gated_delta_rule(q, k, v, g, beta, scale=0.5, initial_state=S0)
    torch.testing.assert_close(o, want_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, want_S, rtol=1e-12, atol=1e-12)


def test_a_sequence_in_pieces_continues_from_the_state_it_is_given() -> None:
    q, k, v, g, beta, S0 = inputs(2)
    whole, S_whole = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=4, initial_state=S0)
    first, S = chunk_gated_delta_rule(*(t[:, :6] for t in (q, k, v, g, beta)), chunk_size=4,
                                      initial_state=S0)  # fmt: skip
    second, S = recurrent_gated_delta_rule(*(t[:, 6:] for t in (q, k, v, g, beta)), initial_state=S)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, S_whole, rtol=1e-12, atol=1e-12)


def test_chunked_and_recurrent_gradients_agree() -> None:
    """Every input's gradient (the initial state's too) through a loss on the outputs and the
    final state: the two forms are the same function."""
    grads = []
    weight = torch.randn(B, T, H, DV, dtype=torch.float64)
    for form in ("chunked", "recurrent"):
        xs = [t.clone().requires_grad_(True) for t in inputs(3)]
        if form == "chunked":
            o, S = chunk_gated_delta_rule(*xs[:5], chunk_size=4, initial_state=xs[5])
        else:
            o, S = recurrent_gated_delta_rule(*xs[:5], initial_state=xs[5])
        ((o * weight).sum() + S.square().sum()).backward()
        grads.append([x.grad for x in xs])
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), *grads, strict=True):
        assert a is not None and b is not None and a.abs().max() > 0, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def test_a_strong_decay_underflows_to_forgetting_instead_of_overflowing() -> None:
    """A decay of e^-60 per token: over the chunk of 13 tokens the products reach e^-780, far
    below float32's range; every factor is an exp of a difference <= 0, so they become 0,
    never inf."""
    q, k, v, g, beta, S0 = inputs(4, dtype=torch.float32)
    g = torch.full_like(g, -60.0)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, initial_state=S0)
    ref_o, ref_S = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S0)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, ref_S, rtol=1e-5, atol=1e-5)


def test_transformers_torch_implementation_computes_the_same() -> None:
    qwen3_next = pytest.importorskip(
        "transformers.models.qwen3_next.modeling_qwen3_next", reason="transformers"
    )
    q, k, v, g, beta, S0 = inputs(5, dtype=torch.float32)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=4, initial_state=S0)
    ref_o, ref_S = qwen3_next.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=4, initial_state=S0, output_final_state=True
    )
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, ref_S, rtol=1e-5, atol=1e-5)
