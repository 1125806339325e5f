"""The gated delta rule (Yang, Kautz & Hatamizadeh 2024; Qwen3-Next's linear attention) in its
two forms: chunked, for training and prefill, and recurrent, one token at a time, for decoding.

Per head, with a state `S` of shape `(d_k, d_v)`, a decay `g_t <= 0` (log space) and a
learning rate `β_t` in (0, 1):

    S_t = exp(g_t) · S_{t-1}                       forget a little of everything
    u_t = β_t · (v_t - S_tᵀ k_t)                   what the state mispredicts for k_t
    S_t = S_t + k_t u_tᵀ                           write the correction (the delta rule)
    o_t = S_tᵀ (scale · q_t)

Chunked form (the WY / UT transform of DeltaNet's parallel training, Yang et al. 2024). Within
a chunk of C tokens entered with state `S`, write γ_i for the cumulative log decay from the
chunk's start to token i and D_ij = exp(γ_i - γ_j) for j <= i (zero above the diagonal).
Unrolling the recurrence gives for the corrections `U = (u_1 … u_C)`

    (I + A) U = β V - β exp(γ) K S,      A_ij = β_i (k_i · k_j) D_ij for j < i

so with one unit-lower-triangular solve `[U0 | W] = (I + A)⁻¹ [β V | β exp(γ) K]` the
corrections are `U = U0 - W S`, the outputs `O = exp(γ) Q S + (Q Kᵀ ⊙ D) U` and the state
after the chunk `exp(γ_C) S + K̃ᵀ U` with `K̃_j = exp(γ_C - γ_j) k_j`. Everything but `U`
and the state is computed for all chunks at once; the scan over chunks does two small
matmuls each, and the outputs are one batched product after it. The decays always appear as
exp of a difference that is <= 0, so a strong decay underflows to 0 instead of overflowing.

Both forms take `(B, T, H, D)` inputs (the layout the projections give), an optional initial
state `(B, H, d_k, d_v)` and return the outputs and the final state. They compute in the
inputs' dtype: the caller chooses it (lmcore's layer runs them in float32 at least).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def chunk_gated_delta_rule(
    q: Float[Tensor, "B T H dk"],
    k: Float[Tensor, "B T H dk"],
    v: Float[Tensor, "B T H dv"],
    g: Float[Tensor, "B T H"],
    beta: Float[Tensor, "B T H"],
    *,
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: Float[Tensor, "B H dk dv"] | None = None,
) -> tuple[Float[Tensor, "B T H dv"], Float[Tensor, "B H dk dv"]]:
    """`(o, state)`: the gated delta rule over T tokens in chunks of `chunk_size` (the module
    docstring), from `initial_state` (None: zeros); `scale` multiplies q (None: d_k^-1/2). A
    sequence shorter than a chunk is one chunk of its length; a last partial chunk is padded
    with tokens that change nothing (k = v = β = 0, no decay)."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    C = max(1, min(chunk_size, T))
    N = -(-T // C)  # chunks
    pad = N * C - T
    if pad:
        q, k, v = (torch.cat([t, t.new_zeros(B, pad, H, t.shape[-1])], dim=1) for t in (q, k, v))
        g, beta = (torch.cat([t, t.new_zeros(B, pad, H)], dim=1) for t in (g, beta))
    # (B, H, N, C, D): heads and chunks as batch dimensions
    q, k, v = (t.reshape(B, N, C, H, t.shape[-1]).permute(0, 3, 1, 2, 4) for t in (q, k, v))
    g, beta = (t.reshape(B, N, C, H).permute(0, 3, 1, 2) for t in (g, beta))

    gamma = g.cumsum(dim=-1)  # (B, H, N, C): log decay from the chunk's start
    later = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    # D_ij = exp(γ_i - γ_j) for j <= i, exactly 0 above the diagonal (exp(-inf)).
    D = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(later, float("-inf")).exp()
    kb = k * beta[..., None]
    # (I + A) is unit lower triangular: the solve reads A's strict lower part only.
    A = (kb @ k.transpose(-1, -2)) * D
    rhs = torch.cat([v * beta[..., None], kb * gamma.exp()[..., None]], dim=-1)
    solved = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U0, W = solved[..., :dv], solved[..., dv:]  # (B, H, N, C, dv), (B, H, N, C, dk)
    last = gamma[..., -1:]  # (B, H, N, 1)
    k_tail = k * (last - gamma).exp()[..., None]  # k_j decayed to the chunk's end
    k_tail_t = k_tail.transpose(-1, -2)  # (B, H, N, dk, C)
    chunk_decay = last.exp()[..., None]  # (B, H, N, 1, 1)

    S = q.new_zeros(B, H, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    entering, corrections = [], []
    for n in range(N):  # the only sequential part: two small matmuls per chunk
        entering.append(S)
        u = U0[:, :, n] - W[:, :, n] @ S  # (B, H, C, dv)
        corrections.append(u)
        S = S * chunk_decay[:, :, n] + k_tail_t[:, :, n] @ u
    S_in = torch.stack(entering, dim=2)  # (B, H, N, dk, dv)
    U = torch.stack(corrections, dim=2)  # (B, H, N, C, dv)

    qs = q * scale
    scores = (qs @ k.transpose(-1, -2)) * D  # (B, H, N, C, C), causal within the chunk
    o = (qs * gamma.exp()[..., None]) @ S_in + scores @ U  # (B, H, N, C, dv)
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, dv)
    return o[:, :T], S


def recurrent_gated_delta_rule(
    q: Float[Tensor, "B T H dk"],
    k: Float[Tensor, "B T H dk"],
    v: Float[Tensor, "B T H dv"],
    g: Float[Tensor, "B T H"],
    beta: Float[Tensor, "B T H"],
    *,
    scale: float | None = None,
    initial_state: Float[Tensor, "B H dk dv"] | None = None,
) -> tuple[Float[Tensor, "B T H dv"], Float[Tensor, "B H dk dv"]]:
    """`(o, state)`: the gated delta rule one token at a time (the module docstring's
    recurrence), from `initial_state` (None: zeros); `scale` multiplies q (None: d_k^-1/2).
    What decoding runs: O(d_k · d_v) per token and head, whatever came before."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    S = q.new_zeros(B, H, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    decay = g.exp()[..., None, None]  # (B, T, H, 1, 1)
    outs = []
    for t in range(T):
        S = S * decay[:, t]
        k_t = k[:, t, :, None, :]  # (B, H, 1, dk)
        u = beta[:, t, :, None, None] * (v[:, t, :, None, :] - k_t @ S)  # (B, H, 1, dv)
        S = S + k_t.transpose(-1, -2) @ u
        outs.append((q[:, t, :, None, :] * scale) @ S)  # (B, H, 1, dv)
    return torch.cat(outs, dim=2).transpose(1, 2), S
