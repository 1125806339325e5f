"""mixer=mla: multi-head latent attention, DeepSeek-V2/V3's (and Kimi K2's) attention.

Keys and values come from one latent per token, `c = norm(x W_dkv)` of `kv_lora_rank`, and a
rotated part `k_pe` of `qk_rope_head_dim` shared by the heads; decoding keeps only those,
`kv_lora_rank + qk_rope_head_dim` numbers per token (`lmcore.model.mla` has the formula and
its two forms). The module is `lmcore.model.mla.MultiHeadLatentAttention`, with Hugging Face's
parameter names (`DeepseekV3Attention`).

Dimensions left at 0 follow the model's `head_dim` D in DeepSeek-V3's proportions (D = 128
there): `qk_nope_head_dim = v_head_dim = D`, `qk_rope_head_dim = D / 2` (rounded down to an
even number, at least 2), `kv_lora_rank = 4·D`; `q_lora_rank` 0 projects q directly
(DeepSeek-V2-Lite), V3 uses 1536. Every head has its own keys and values, so `num_kv_heads`
does not apply. The mixer rotates its `qk_rope_head_dim` dimensions itself, with its own tables
(`rope_theta`): the model's `pos=` rotation is built for `head_dim`-wide heads and is not used;
an additive bias (`pos=alibi`) is.
"""

from __future__ import annotations

from typing import Any

import torch

from lmcore import Arg, Component, hookimpl
from lmcore.model.attention import Plan, accumulator, kept_elements
from lmcore.model.mla import MultiHeadLatentAttention


def widths(
    head_dim: int,
    kv_lora_rank: int = 0,
    qk_nope_head_dim: int = 0,
    qk_rope_head_dim: int = 0,
    v_head_dim: int = 0,
) -> tuple[int, int, int, int]:
    """`(kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)`, each 0 replaced by
    its default from `head_dim` (module docstring)."""
    return (
        kv_lora_rank or 4 * head_dim,
        qk_nope_head_dim or head_dim,
        qk_rope_head_dim or 2 * max(1, head_dim // 4),
        v_head_dim or head_dim,
    )


def build(
    *,
    d_model: int,
    num_heads: int,
    head_dim: int,
    context_length: int,
    kv_lora_rank: int,
    q_lora_rank: int,
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    v_head_dim: int,
    rope_theta: float,
    rope_interleave: bool,
    eps: float,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> MultiHeadLatentAttention:
    r, n, p, v = widths(head_dim, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    return MultiHeadLatentAttention(
        d_model=d_model, num_heads=num_heads, context_length=context_length, kv_lora_rank=r,
        q_lora_rank=q_lora_rank, qk_nope_head_dim=n, qk_rope_head_dim=p, v_head_dim=v,
        rope_theta=rope_theta, rope_interleave=rope_interleave, eps=eps, device=device,
        dtype=dtype,
    )  # fmt: skip


def params(d_model: int, num_heads: int, head_dim: int, q_lora_rank: int, **args: Any) -> int:
    r, n, p, v = widths(head_dim, **_dims(args))
    q = (
        q_lora_rank * (d_model + 1 + num_heads * (n + p))
        if q_lora_rank
        else d_model * num_heads * (n + p)
    )
    return q + d_model * (r + p) + r + r * num_heads * (n + v) + num_heads * v * d_model


def flops(
    d_model: int, num_heads: int, head_dim: int, q_lora_rank: int, seq_len: int, kv_len: int,
    **args: Any,
) -> int:  # fmt: skip
    """The plain (expanded) forward of `seq_len` queries against `kv_len` keys: the
    projections, kv_b_proj over the keys' latents, and the attention operator's two matmuls
    over heads `max(n + p, v)` wide (the narrower padded with zeros)."""
    r, n, p, v = widths(head_dim, **_dims(args))
    H = num_heads
    q = q_lora_rank * (d_model + H * (n + p)) if q_lora_rank else d_model * H * (n + p)
    per_query = q + d_model * (r + p) + H * v * d_model
    attention = 2 * H * seq_len * kv_len * max(n + p, v)
    return 2 * (seq_len * per_query + kv_len * r * H * (n + v) + attention)


def activations(
    d_model: int, num_heads: int, head_dim: int, q_lora_rank: int, batch: int, seq_len: int,
    dtype: torch.dtype, **args: Any,
) -> int:  # fmt: skip
    """Bytes kept for backward: x (the projections'), each norm's float32 input (the projection
    output itself in float32), its 1 / rms and its output before the gain, the inputs of q_b_proj,
    kv_b_proj and o_proj, the rotation's cos and sin (gathered once, `(1, T, p/2)`); the
    attention operator's q, k, v and output (`max(n + p, v)` wide; v is the slice of kv_b_proj's
    output it is when not padded) and its float32 softmax statistics and weights."""
    r, n, p, v = widths(head_dim, **_dims(args))
    H, N, size = num_heads, batch * seq_len, dtype.itemsize
    wide = torch.promote_types(dtype, torch.float32)  # the norms compute in it
    width = max(n + p, v)

    def norm(inputs: int, w: int) -> int:  # what one LatentNorm keeps for N rows
        kept_input = inputs if wide == dtype else w  # x itself when already wide, else a copy
        return N * (kept_input * wide.itemsize + wide.itemsize + w * size)

    tensors = N * (d_model + r + H * v) * size + seq_len * p * size  # x, inputs, cos and sin
    tensors += norm(r + p, r)
    if q_lora_rank:
        tensors += norm(q_lora_rank, q_lora_rank) + N * q_lora_rank * size
    values = H * (width if v < width else n + v)  # padded, or the slice of kv_b_proj's output
    tensors += N * (3 * H * width + values) * size
    plan = Plan(batch, H, H, seq_len, seq_len, width, True, 0)
    return tensors + accumulator(dtype).itemsize * (batch * H * seq_len + kept_elements(plan))


def buffers(head_dim: int, context_length: int, qk_rope_head_dim: int) -> int:
    """The rotation's cos and sin, `(context_length, qk_rope_head_dim / 2)` float32 each."""
    p = widths(head_dim, qk_rope_head_dim=qk_rope_head_dim)[2]
    return 2 * 4 * context_length * (p // 2)


def temporaries(head_dim: int, context_length: int, qk_rope_head_dim: int) -> int:
    """What the tables are computed from: the float32 positions and angles."""
    p = widths(head_dim, qk_rope_head_dim=qk_rope_head_dim)[2]
    return 4 * context_length * (1 + p // 2)


def state(
    head_dim: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype: torch.dtype
) -> tuple[int, int]:
    r, _, p, _ = widths(head_dim, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
    return (r + p) * dtype.itemsize, 0


def _dims(args: dict[str, Any]) -> dict[str, int]:
    names = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    return {k: args[k] for k in names}


def _validate(head_dim: int, qk_rope_head_dim: int) -> None:
    p = widths(head_dim, qk_rope_head_dim=qk_rope_head_dim)[2]
    if p % 2:
        raise ValueError(
            f"qk_rope_head_dim={p}: the rotation turns pairs of dimensions; give an even "
            "qk_rope_head_dim (DeepSeek-V3: 64), or 0 for its default from head_dim"
        )


ARGS = (
    Arg("kv_lora_rank", int, 0, "width of the latent c, what decoding keeps per token "
        "(0: 4·head_dim; DeepSeek-V3: 512)", ge=0),
    Arg("q_lora_rank", int, 0, "width of q's low-rank bottleneck q_a_proj -> q_b_proj "
        "(0: none, q_proj; DeepSeek-V3: 1536)", ge=0),
    Arg("qk_nope_head_dim", int, 0, "per-head query/key dimensions without position "
        "(0: head_dim; DeepSeek-V3: 128)", ge=0),
    Arg("qk_rope_head_dim", int, 0, "rotated query/key dimensions, the key's shared by the "
        "heads (0: head_dim / 2, even; DeepSeek-V3: 64)", ge=0),
    Arg("v_head_dim", int, 0, "per-head value dimensions (0: head_dim; DeepSeek-V3: 128)", ge=0),
    Arg("rope_theta", float, 10000.0, "base of the rotation's frequencies", gt=0.0),
    Arg("rope_interleave", bool, True, "rotate pairs (x[2k], x[2k+1]) as DeepSeek's weights "
        "expect (Hugging Face's rope_interleave); false: (x[k], x[k + p/2])"),
    Arg("eps", float, 1e-6, "of q_a_layernorm and kv_a_layernorm (RMSNorm)", gt=0.0),
)  # fmt: skip


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="mla",
            build=build,
            args=ARGS,
            help="multi-head latent attention (DeepSeek-V2/V3): keys and values from a latent "
            "per token, which is all decoding keeps",
            params=params,
            flops=flops,
            activations=activations,
            buffers=buffers,
            temporaries=temporaries,
            state=state,
            validate=_validate,
            features=frozenset({"compile", "mask"}),
        )
    ]
