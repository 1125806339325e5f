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
from jaxtyping import Float, Int
from torch import Tensor

from lmcore.model.documents import ChunkResets


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
    documents: Int[Tensor, "B T"] | None = None,
) -> tuple[Float[Tensor, "B T H dv"], Float[Tensor, "B H dk dv"]]:
    """`(o, state)`: the gated delta rule over T tokens in chunks of `chunk_size` (the module
    docstring), from `initial_state` (None: zeros); `scale` multiplies q (None: d_k^-1/2). A
    sequence shorter than a chunk is one chunk of its length; a last partial chunk is padded
    with tokens that change nothing (k = v = β = 0, no decay). With `documents` (packed rows)
    the state is reset at each document's first token (`lmcore.model.documents.ChunkResets`)."""
    B, T, H, dk = k.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    C = max(1, min(chunk_size, T))
    N = -(-T // C)  # chunks
    # (B·H, N, C, D), contiguous: one copy each, which also pads the last chunk with zeros.
    q, k, v = (_chunked(t, N, C) for t in (q, k, v))
    g, beta = (_chunked(t[..., None], N, C)[..., 0] for t in (g, beta))

    gamma = g.cumsum(dim=-1)  # (BH, N, C): log decay from the chunk's start
    later = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    # D_ij = exp(γ_i - γ_j) for j <= i, exactly 0 above the diagonal (exp(-inf)).
    D = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(later, float("-inf")).exp()
    resets = None
    if documents is not None:  # no decay crosses a document's first token
        resets = ChunkResets.of(documents, H, N, C, q.dtype)
        D = D * resets.within
    kb = k * beta[..., None]
    # (I + A)⁻¹ by a solve against the identity: the solve reads A's strict lower part only;
    # with C columns it is cheaper than solving for the d_v + d_k columns of U0 and W.
    A = (kb @ k.transpose(-1, -2)) * D
    eye = torch.eye(C, dtype=q.dtype, device=q.device).expand_as(A)
    inverse = torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)
    U0 = inverse @ (v * beta[..., None])  # (BH, N, C, dv)
    W = inverse @ (kb * _entering(gamma.exp(), resets)[..., None])  # (BH, N, C, dk)
    last = gamma[..., -1:]  # (BH, N, 1)
    to_end = (last - gamma).exp() if resets is None else (last - gamma).exp() * resets.leaving
    k_tail_t = (k * to_end[..., None]).transpose(-1, -2)  # (BH, N, dk, C)
    chunk_decay = last.exp()[..., None]  # (BH, N, 1, 1): k_tail is k decayed to the chunk's end
    if resets is not None:
        chunk_decay = chunk_decay * resets.through[..., None, None]

    S = q.new_zeros(B * H, dk, dv)
    if initial_state is not None:
        S = initial_state.to(q.dtype).reshape(B * H, dk, dv)
    entering, corrections = [], []
    for n in range(N):  # the only sequential part: two small matmuls per chunk
        entering.append(S)
        u = torch.baddbmm(U0[:, n], W[:, n], S, alpha=-1)  # U0 - W S, (BH, C, dv)
        corrections.append(u)
        S = torch.baddbmm(S * chunk_decay[:, n], k_tail_t[:, n], u)
    S_in = torch.stack(entering, dim=1)  # (BH, N, dk, dv)
    U = torch.stack(corrections, dim=1)  # (BH, N, C, dv)

    qs = q * scale
    scores = (qs @ k.transpose(-1, -2)) * D  # (BH, N, C, C), causal within the chunk
    o = (qs * _entering(gamma.exp(), resets)[..., None]) @ S_in + scores @ U  # (BH, N, C, dv)
    o = o.reshape(B, H, N * C, dv)[:, :, :T].transpose(1, 2)
    return o, S.reshape(B, H, dk, dv)


def _entering(decay: Tensor, resets: ChunkResets | None) -> Tensor:
    """The decay from a chunk's start, zero for the tokens a document boundary cuts off."""
    return decay if resets is None else decay * resets.entering


def _chunked(t: Float[Tensor, "B T H D"], N: int, C: int) -> Float[Tensor, "BH N C D"]:
    """`t` heads first and cut into N chunks of C tokens, zeros after its T tokens."""
    B, T, H, D = t.shape
    out = t.new_zeros(B, H, N * C, D) if N * C > T else t.new_empty(B, H, T, D)
    out[:, :, :T] = t.transpose(1, 2)
    return out.view(B * H, N, C, D)


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
