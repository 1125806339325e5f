"""Mamba-2's state space duality (SSD, Dao & Gu 2024) in its two forms: chunked, for training
and prefill, and recurrent, one token at a time, for decoding.

Per head, with a state `h` of shape `(head_dim, d_state)`, a step `dt_t > 0` and a scalar
`A < 0` shared by the head's tokens:

    h_t = exp(dt_t · A) · h_{t-1} + dt_t · x_t B_tᵀ      forget, then write x_t at B_t
    y_t = h_t C_t + D · x_t                             read at C_t, plus the skip

B and C come in `n_groups` groups, each serving `H / n_groups` consecutive heads.

Chunked form. Within a chunk of C tokens entered with state `h`, write a_t = dt_t · A (<= 0),
γ_i for the cumulative a from the chunk's start to token i and L_ij = exp(γ_i - γ_j) for
j <= i (zero above the diagonal). Unrolling the recurrence,

    Y = (C Bᵀ ⊙ L) (dt · X) + exp(γ) C hᵀ        within the chunk, and from the entering state
    h' = exp(γ_C) h + (dt · X)ᵀ (exp(γ_C - γ) B)  the state after the chunk

Everything but the states entering each chunk is computed for all chunks at once; the scan
over chunks is a multiply-add each. The decays always appear as exp of a difference that is
<= 0, so a strong decay underflows to 0 instead of overflowing.

Both forms take `(B, T, H, P)` inputs (P = head_dim), `(B, T, G, N)` for B and C (N =
d_state), an optional initial state `(B, H, P, N)` (transformers' layout) and return the
outputs and the final state. They compute in the inputs' dtype: the caller chooses it
(lmcore's layer runs them in float32 at least).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lmcore.model.documents import ChunkResets


def chunk_ssd(
    x: Float[Tensor, "B T H P"],
    dt: Float[Tensor, "B T H"],
    A: Float[Tensor, " H"],
    b: Float[Tensor, "B T G N"],
    c: Float[Tensor, "B T G N"],
    *,
    D: Float[Tensor, " H"] | None = None,
    chunk_size: int = 256,
    initial_state: Float[Tensor, "B H P N"] | None = None,
    documents: Int[Tensor, "B T"] | None = None,
) -> tuple[Float[Tensor, "B T H P"], Float[Tensor, "B H P N"]]:
    """`(y, state)`: SSD over T tokens in chunks of `chunk_size` (the module docstring), from
    `initial_state` (None: zeros); `D` (None: no skip) adds `D · x`. A sequence shorter than a
    chunk is one chunk of its length; a last partial chunk is padded with tokens that change
    nothing (x = B = C = 0, dt = 0: no decay). With `documents` (packed rows) the state is
    reset at each document's first token (`lmcore.model.documents.ChunkResets`)."""
    Bsz, T, H, P = x.shape
    G, N_ = b.shape[2], b.shape[3]
    C = max(1, min(chunk_size, T))
    N = -(-T // C)  # chunks
    xdt = _chunked(x * dt[..., None], N, C)  # (B·H, N, C, P)
    bh, ch = (_chunked(_heads(t, H // G), N, C) for t in (b, c))  # (B·H, N, C, d_state)
    a = _chunked((dt * A)[..., None], N, C)[..., 0]  # (B·H, N, C), <= 0

    gamma = a.cumsum(dim=-1)  # log decay from the chunk's start
    later = torch.ones(C, C, dtype=torch.bool, device=x.device).triu(1)
    # L_ij = exp(γ_i - γ_j) for j <= i, exactly 0 above the diagonal (exp(-inf)).
    L = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(later, float("-inf")).exp()
    last = gamma[..., -1:]  # (BH, N, 1)
    to_end, from_start = (last - gamma).exp(), gamma.exp()  # (BH, N, C)
    chunk_decay = last.exp()[..., None]  # (BH, N, 1, 1)
    if documents is not None:  # no decay crosses a document's first token
        resets = ChunkResets.of(documents, H, N, C, x.dtype)
        L, to_end = L * resets.within, to_end * resets.leaving
        from_start = from_start * resets.entering
        chunk_decay = chunk_decay * resets.through[..., None, None]
    # What each chunk alone writes to the state, decayed to its end: (BH, N, P, d_state).
    written = xdt.transpose(-1, -2) @ (bh * to_end[..., None])

    h = x.new_zeros(Bsz * H, P, N_)
    if initial_state is not None:
        h = initial_state.to(x.dtype).reshape(Bsz * H, P, N_)
    entering = []
    for n in range(N):  # the only sequential part: a multiply-add per chunk
        entering.append(h)
        h = torch.addcmul(written[:, n], h, chunk_decay[:, n])
    h_in = torch.stack(entering, dim=1)  # (BH, N, P, d_state)

    scores = (ch @ bh.transpose(-1, -2)) * L  # (BH, N, C, C), causal within the chunk
    y = scores @ xdt + (ch * from_start[..., None]) @ h_in.transpose(-1, -2)
    y = y.reshape(Bsz, H, N * C, P)[:, :, :T].transpose(1, 2)  # (B, T, H, P)
    if D is not None:
        y = y + x * D[:, None].to(x.dtype)
    return y, h.reshape(Bsz, H, P, N_)


def _heads(t: Float[Tensor, "B T G N"], per_group: int) -> Float[Tensor, "B T H N"]:
    """Group g's B or C for its heads g·per_group … (g+1)·per_group - 1 (a view: expanded)."""
    Bsz, T, G, N = t.shape
    return t[:, :, :, None].expand(Bsz, T, G, per_group, N).reshape(Bsz, T, G * per_group, N)


def _chunked(t: Float[Tensor, "B T H D"], N: int, C: int) -> Float[Tensor, "BH N C D"]:
    """`t` heads first and cut into N chunks of C tokens, zeros after its T tokens."""
    B, T, H, D = t.shape
    out = t.new_zeros(B, H, N * C, D) if N * C > T else t.new_empty(B, H, T, D)
    out[:, :, :T] = t.transpose(1, 2)
    return out.view(B * H, N, C, D)


def recurrent_ssd(
    x: Float[Tensor, "B T H P"],
    dt: Float[Tensor, "B T H"],
    A: Float[Tensor, " H"],
    b: Float[Tensor, "B T G N"],
    c: Float[Tensor, "B T G N"],
    *,
    D: Float[Tensor, " H"] | None = None,
    initial_state: Float[Tensor, "B H P N"] | None = None,
) -> tuple[Float[Tensor, "B T H P"], Float[Tensor, "B H P N"]]:
    """`(y, state)`: SSD one token at a time (the module docstring's recurrence), from
    `initial_state` (None: zeros). What decoding runs: O(head_dim · d_state) per token and
    head, whatever came before."""
    Bsz, T, H, P = x.shape
    G, N_ = b.shape[2], b.shape[3]
    bh, ch = _heads(b, H // G), _heads(c, H // G)  # (B, T, H, d_state)
    h = x.new_zeros(Bsz, H, P, N_) if initial_state is None else initial_state.to(x.dtype)
    decay = (dt * A).exp()[..., None, None]  # (B, T, H, 1, 1)
    xdt = x * dt[..., None]
    outs = []
    for t in range(T):
        h = h * decay[:, t] + xdt[:, t, :, :, None] * bh[:, t, :, None, :]
        outs.append(h @ ch[:, t, :, :, None])  # (B, H, P, 1)
    y = torch.stack(outs, dim=1)[..., 0]  # (B, T, H, P)
    if D is not None:
        y = y + x * D[:, None].to(x.dtype)
    return y, h
