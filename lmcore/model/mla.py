"""Multi-head latent attention (DeepSeek-V2, 2024; V3, Kimi K2): attention whose keys and values
are made from one small latent per token, so that decoding keeps that latent instead of them.

Per token, with H heads and the dimensions `n = qk_nope_head_dim`, `p = qk_rope_head_dim`,
`v = v_head_dim`, `r = kv_lora_rank`:

    q_h = (q_proj x)_h, or (q_b_proj · norm(q_a_proj x))_h          (n + p) per head
    [c ; k_pe] = kv_a_proj_with_mqa x,   c = norm(c)                 r and p, shared by the heads
    [k_nope_h ; v_h] = (kv_b_proj c)_h                               n and v per head
    k_h = [k_nope_h ; rot(k_pe)],  q_h = [q_nope_h ; rot(q_pe_h)]
    o = o_proj [softmax(q_h k_hᵀ / sqrt(n + p)) v_h]_h

The rotation (`rot`) turns only the `p` decoupled dimensions, with tables of their own
(`rope_theta`), the same for every head; the `n` others carry no position, so that
`q_nope_h · k_nope_h = (W_uk_hᵀ q_nope_h) · c` with `W_uk_h` head h's key rows of `kv_b_proj`:
the keys need never be expanded. Two forms, the same function:

- expanded (training, a prefill): keys and values of every head from `kv_b_proj`, then attention
  over `n + p`-wide heads;
- absorbed (a decoding step against the cache): the query is taken into the latent space,
  `[W_uk_hᵀ q_nope_h ; rot(q_pe_h)]`, and attends to the cached `[c ; rot(k_pe)]` directly, one
  key "head" for all H query heads (multi-query attention over the latent); the weighted sum
  of latents goes through `W_uv_h` (head h's value rows of `kv_b_proj`) afterwards.

Decoding keeps `r + p` numbers per token, whatever the heads (`ContextState`, one `(B, context,
r + p)` tensor "latent": the normalised `c`, then the rotated `k_pe`), against `2·H·(n + p)`
for the keys and values of full attention.

Both forms run through lmcore's tiled attention operator, whose heads have one width: the
narrower of the query/key and value widths is padded with zeros (as Hugging Face does for
flash attention; a zero column adds nothing to a score or an output), and the absorbed form's
values are the cached rows themselves, whose last `p` outputs are dropped.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from lmcore.interfaces import LayerContext
from lmcore.model.attention import tiled_attention
from lmcore.model.cache import ContextState
from lmcore.model.nn import Linear
from lmcore.model.roles import GAIN, Role, packed


class LatentNorm(nn.Module):
    """RMSNorm as DeepSeek's `q_a_layernorm` / `kv_a_layernorm` compute it: in float32,
    `weight · (x / sqrt(mean(x²) + eps))` with the gain applied after the cast back to the
    input dtype. State-dict key: weight."""

    def __init__(
        self,
        width: int,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width, device=device, dtype=dtype))

    def forward(self, x: Float[Tensor, "... width"]) -> Float[Tensor, "... width"]:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rotary_tables(
    theta: float,
    dim: int,
    length: int,
    device: torch.device | str | None = None,
    *,
    inv_freq: Float[Tensor, " half"] | None = None,
    attention_factor: float = 1.0,
) -> tuple[Float[Tensor, "length half"], Float[Tensor, "length half"]]:
    """cos and sin of `pos · f_k`, k = 0 … dim/2-1, for positions 0 … length-1, each times
    `attention_factor` (YaRN's), in float32 (computed on the CPU and moved: the same numbers on
    every device); on meta only their shapes. `f_k` is `inv_freq` when given (a scaled rope's
    frequencies), else `1 / theta^(2k/dim)`."""
    shape = (length, dim // 2)
    if device is not None and torch.device(device).type == "meta":
        return torch.empty(shape, device="meta"), torch.empty(shape, device="meta")
    if inv_freq is None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    inv_freq = inv_freq.to("cpu", torch.float32)
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    if attention_factor != 1.0:  # as Hugging Face scales its cos and sin (YaRN's mscale)
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(device), sin.to(device)


def rotate(
    x: Float[Tensor, "... p"], cos: Float[Tensor, "... half"], sin: Float[Tensor, "... half"],
    *, interleave: bool,
) -> Float[Tensor, "... p"]:  # fmt: skip
    """Rotate pairs of `x` by the angles whose cos and sin are given: with `interleave`, the
    pairs `(x[2k], x[2k+1])` (DeepSeek's layout, Hugging Face's `rope_interleave=True`), else
    `(x[k], x[k + p/2])` (`rope_interleave=False`). The result lists the first members of the
    pairs, then the second ones, as Hugging Face returns them in both layouts (an order of the
    dimensions that q and k share: their products do not depend on it)."""
    a, b = (x[..., 0::2], x[..., 1::2]) if interleave else x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def _widen(t: Tensor, width: int) -> Tensor:
    """`t` with zeros appended to `width` along its last dimension (itself when as wide)."""
    extra = width - t.shape[-1]
    return t if extra == 0 else torch.cat((t, t.new_zeros(*t.shape[:-1], extra)), dim=-1)


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (module docstring), DeepSeek-V3's attention with Hugging
    Face's parameter names, so a checkpoint's `self_attn.*` tensors load as `attn.*`:

        q_proj (q_lora_rank 0) or q_a_proj, q_a_layernorm, q_b_proj
        kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj

    each a `.weight`; with `bias` (Hugging Face's `attention_bias`), q_a_proj,
    kv_a_proj_with_mqa and o_proj also have a `.bias`, as DeepseekV3Attention's do.
    `kv_b_proj` holds, per head, `qk_nope_head_dim` key rows then `v_head_dim` value rows;
    `q_proj`/`q_b_proj` per head `qk_nope_head_dim` rows then `qk_rope_head_dim`. The
    rotation's cos and sin are non-persistent buffers (`context_length, qk_rope_head_dim / 2`),
    float32, from `inv_freq` when given (a scaled rotation's frequencies, e.g. YaRN's) and
    multiplied by `attention_factor`; `softmax_scale` replaces `1 / sqrt(n + p)` when given
    (DeepSeek's YaRN multiplies it by `mscale²`).
    """

    cos: Tensor
    sin: Tensor

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        context_length: int,
        kv_lora_rank: int,
        q_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        rope_theta: float = 10000.0,
        rope_interleave: bool = True,
        eps: float = 1e-6,
        bias: bool = False,
        inv_freq: Float[Tensor, " half"] | None = None,
        attention_factor: float = 1.0,
        softmax_scale: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.num_heads, self.kv_lora_rank, self.q_lora_rank = num_heads, kv_lora_rank, q_lora_rank
        self.nope, self.rope, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.rope_interleave = rope_interleave
        default_scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
        self.scale = default_scale if softmax_scale is None else softmax_scale
        qk_width = num_heads * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank:
            self.q_a_proj = Linear(d_model, q_lora_rank, device=device, dtype=dtype, bias=bias)
            self.q_a_layernorm = LatentNorm(q_lora_rank, eps, device=device, dtype=dtype)
            self.q_b_proj = Linear(q_lora_rank, qk_width, device=device, dtype=dtype)
        else:
            self.q_proj = Linear(d_model, qk_width, device=device, dtype=dtype)
        # Two logical matrices in one: the latent (compressed k and v) and the shared rope key.
        self.kv_a_proj_with_mqa = Linear(
            d_model, kv_lora_rank + qk_rope_head_dim, device=device, dtype=dtype, bias=bias,
            role=packed(kv_lora_rank, qk_rope_head_dim),
        )  # fmt: skip
        self.kv_a_layernorm = LatentNorm(kv_lora_rank, eps, device=device, dtype=dtype)
        # Per head, its nope key then its value: 2 × num_heads logical matrices.
        self.kv_b_proj = Linear(
            kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), device=device, dtype=dtype,
            role=packed(*[qk_nope_head_dim, v_head_dim] * num_heads),
        )  # fmt: skip
        self.o_proj = Linear(
            num_heads * v_head_dim, d_model, device=device, dtype=dtype, bias=bias
        )
        cos, sin = rotary_tables(
            rope_theta, qk_rope_head_dim, context_length, device,
            inv_freq=inv_freq, attention_factor=attention_factor,
        )  # fmt: skip
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> ContextState:
        """Per sequence and token, the normalised latent `c` then the rotated `k_pe`:
        `(batch, context_length, kv_lora_rank + qk_rope_head_dim)`, zero-filled (a slot is read
        only once written; zeros keep the state a function of the tokens fed)."""
        width = self.kv_lora_rank + self.rope
        return ContextState(
            {"latent": torch.zeros(batch, context_length, width, device=device, dtype=dtype)}
        )

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        B, T, _ = x.shape
        H, r = self.num_heads, self.kv_lora_rank
        cache = context.cache
        start = 0 if cache is None else cache.start
        if self.q_lora_rank:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.view(B, T, H, self.nope + self.rope).transpose(1, 2)  # (B, H, T, n + p)
        q_nope, q_pe = q.split((self.nope, self.rope), dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split((r, self.rope), dim=-1)  # (B, T, r), (B, T, p)
        c = self.kv_a_layernorm(c)
        positions = context.positions
        if positions is None:
            positions = torch.arange(start, start + T, device=x.device)[None]
        cos = self.cos[positions][:, None].to(x.dtype)  # (B or 1, 1, T, p/2)
        sin = self.sin[positions][:, None].to(x.dtype)
        q_pe = rotate(q_pe, cos, sin, interleave=self.rope_interleave)  # (B, H, T, p)
        k_pe = rotate(k_pe[:, None], cos, sin, interleave=self.rope_interleave)  # (B, 1, T, p)
        if cache is not None:  # the state after these tokens, written in place
            latent = cache.state["latent"]
            latent[:, start : start + T, :r] = c
            latent[:, start : start + T, r:] = k_pe[:, 0]
        if start == 0:  # training, or a prefill: nothing cached before these tokens
            out = self._expanded(
                q_nope, q_pe, c, k_pe, context.mask, context.bias, context.documents
            )
        else:  # a step after cached tokens: against their latents
            held = cache.state["latent"][:, : start + T]
            out = self._absorbed(q_nope, q_pe, held, context.mask, context.bias)
        # Always a copy, never a view of `out`, which the attention operator may keep for its
        # backward: o_proj keeps its own input, counted apart.
        heads = out.transpose(1, 2).clone(memory_format=torch.contiguous_format)
        y: Tensor = self.o_proj(heads.flatten(2))  # (B, T, H·v)
        return y

    def _expanded(
        self,
        q_nope: Float[Tensor, "B H T n"],
        q_pe: Float[Tensor, "B H T p"],
        c: Float[Tensor, "B T r"],
        k_pe: Float[Tensor, "B 1 T p"],
        mask: Bool[Tensor, "B 1 T T"] | None,
        bias: Float[Tensor, "... H T T"] | None,
        documents: Int[Tensor, "B T"] | None = None,
    ) -> Float[Tensor, "B H T v"]:
        """Keys and values of every head from the latents, then attention over them (within
        each document, with `documents`)."""
        B, H, T, _ = q_nope.shape
        kv = self.kv_b_proj(c).view(B, T, H, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split((self.nope, self.v_dim), dim=-1)  # (B, H, T, n), (B, H, T, v)
        width = max(self.nope + self.rope, self.v_dim)  # the operator's one head width
        query = _widen(torch.cat((q_nope, q_pe), dim=-1), width)
        key = _widen(torch.cat((k_nope, k_pe.expand(B, H, T, self.rope)), dim=-1), width)
        out = tiled_attention(
            query, key, _widen(v, width), causal=True, mask=mask, bias=bias, scale=self.scale,
            documents=documents,
        )  # fmt: skip
        return out[..., : self.v_dim]

    def _absorbed(
        self,
        q_nope: Float[Tensor, "B H T n"],
        q_pe: Float[Tensor, "B H T p"],
        latent: Float[Tensor, "B S r_p"],
        mask: Bool[Tensor, "B 1 T S"] | None,
        bias: Float[Tensor, "... H T S"] | None,
    ) -> Float[Tensor, "B H T v"]:
        """The queries taken into the latent space attend to the cached latents, one key head
        for every query head; the result goes through the value rows of kv_b_proj."""
        H, r = self.num_heads, self.kv_lora_rank
        w = self.kv_b_proj.weight.view(H, self.nope + self.v_dim, r)
        w_uk, w_uv = w[:, : self.nope], w[:, self.nope :]  # (H, n, r), (H, v, r)
        query = torch.cat((q_nope @ w_uk, q_pe), dim=-1)  # (B, H, T, r + p)
        keys = latent[:, None]  # (B, 1, S, r + p): the values too, their last p outputs dropped
        out = tiled_attention(
            query, keys, keys, causal=True, mask=mask, bias=bias, scale=self.scale
        )
        return out[..., :r] @ w_uv.transpose(1, 2)  # (B, H, T, v)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
            f"q_lora_rank={self.q_lora_rank}, qk_nope_head_dim={self.nope}, "
            f"qk_rope_head_dim={self.rope}, v_head_dim={self.v_dim}"
        )
