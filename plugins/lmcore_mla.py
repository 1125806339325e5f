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

`scaling=yarn` stretches that rotation as DeepSeek-V3's long-context weights were trained
(YaRN, Peng et al. 2023; Hugging Face's `rope_type: yarn`; the rope plugin's frequencies and
attention factor, `lmcore.model.rotary`): the frequencies blend between
`f` and `f / factor` over the band `beta_fast` … `beta_slow` rotations within
`original_context_length`; cos and sin are multiplied by the attention factor (given, or
`mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when both are given, else
`mscale(factor, 1)`, with `mscale(s, m) = 0.1 · m · ln s + 1`), and with `mscale_all_dim` the
softmax scale `1 / sqrt(n + p)` is multiplied by `mscale(factor, mscale_all_dim)²`, as
DeepseekV3Attention's is. `bias=true` gives q_a_proj, kv_a_proj_with_mqa and o_proj biases
(`attention_bias`).
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch import Tensor

from lmcore import Arg, Component, hookimpl
from lmcore.model.attention import Plan, accumulator, kept_elements
from lmcore.model.mla import MultiHeadLatentAttention
from lmcore.model.rotary import inverse_frequencies, yarn_attention_factor, yarn_mscale


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
    bias: bool = False,
    scaling: str = "none",
    factor: float = 1.0,
    original_context_length: int = 8192,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float = 0.0,
    mscale_all_dim: float = 0.0,
    attention_factor: float = 0.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> MultiHeadLatentAttention:
    r, n, p, v = widths(head_dim, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
    inv_freq: Tensor | None = None
    cos_sin_factor, softmax_scale = 1.0, (n + p) ** -0.5
    if scaling == "yarn":
        inv_freq = inverse_frequencies(
            rope_theta, p, scaling="yarn", factor=factor,
            original_context_length=original_context_length, beta_fast=beta_fast,
            beta_slow=beta_slow,
        )  # fmt: skip
        cos_sin_factor = yarn_attention_factor(factor, attention_factor, mscale, mscale_all_dim)
        if mscale_all_dim:  # DeepSeek's: the scale times mscale² (Hugging Face's order)
            m = yarn_mscale(factor, mscale_all_dim)
            softmax_scale = softmax_scale * m * m
    return MultiHeadLatentAttention(
        d_model=d_model, num_heads=num_heads, context_length=context_length, kv_lora_rank=r,
        q_lora_rank=q_lora_rank, qk_nope_head_dim=n, qk_rope_head_dim=p, v_head_dim=v,
        rope_theta=rope_theta, rope_interleave=rope_interleave, eps=eps, bias=bias,
        inv_freq=inv_freq, attention_factor=cos_sin_factor, softmax_scale=softmax_scale,
        device=device, dtype=dtype,
    )  # fmt: skip


def params(
    d_model: int, num_heads: int, head_dim: int, q_lora_rank: int, bias: bool = False,
    **args: Any,
) -> int:  # fmt: skip
    """The projections and the two norms' gains; with `bias`, q_a_proj's (with a q
    bottleneck), kv_a_proj_with_mqa's and o_proj's biases."""
    r, n, p, v = widths(head_dim, **_dims(args))
    q = (
        q_lora_rank * (d_model + 1 + num_heads * (n + p))
        if q_lora_rank
        else d_model * num_heads * (n + p)
    )
    biases = (q_lora_rank + r + p + d_model) if bias else 0
    return q + d_model * (r + p) + r + r * num_heads * (n + v) + num_heads * v * d_model + biases


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


SCALINGS: Final = ("none", "yarn")
# The YaRN arguments and their defaults: each has an effect only with scaling=yarn.
_YARN: Final = {
    "factor": 1.0,
    "original_context_length": 8192,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.0,
    "mscale_all_dim": 0.0,
    "attention_factor": 0.0,
}


def _validate(
    head_dim: int,
    qk_rope_head_dim: int,
    scaling: str = "none",
    factor: float = 1.0,
    original_context_length: int = 8192,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float = 0.0,
    mscale_all_dim: float = 0.0,
    attention_factor: float = 0.0,
) -> None:
    p = widths(head_dim, qk_rope_head_dim=qk_rope_head_dim)[2]
    if p % 2:
        raise ValueError(
            f"qk_rope_head_dim={p}: the rotation turns pairs of dimensions; give an even "
            "qk_rope_head_dim (DeepSeek-V3: 64), or 0 for its default from head_dim"
        )
    given = {
        "factor": factor, "original_context_length": original_context_length,
        "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": mscale,
        "mscale_all_dim": mscale_all_dim, "attention_factor": attention_factor,
    }  # fmt: skip
    if scaling != "yarn":
        for name, value in given.items():
            if value != _YARN[name]:
                raise ValueError(
                    f"{name}={value} has no effect with scaling={scaling}; it applies with "
                    f"scaling=yarn (or drop {name})"
                )
    elif not beta_fast > beta_slow:
        raise ValueError(
            f"scaling=yarn blends between beta_slow and beta_fast rotations, so "
            f"beta_fast={beta_fast} must exceed beta_slow={beta_slow}"
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
    Arg("bias", bool, False, "biases on q_a_proj, kv_a_proj_with_mqa and o_proj (Hugging "
        "Face's attention_bias)", written="changed"),
    Arg("scaling", str, "none", "the rotation's frequency scaling: none, or yarn "
        "(DeepSeek-V3's long context)", choices=SCALINGS, written="changed"),
    Arg("factor", float, 1.0, "yarn: how much longer the context gets", gt=0.0,
        written="changed"),
    Arg("original_context_length", int, 8192, "yarn: the context length the model was "
        "trained at", ge=1, written="changed"),
    Arg("beta_fast", float, 32.0, "yarn: rotations above which frequencies are kept",
        gt=0.0, written="changed"),
    Arg("beta_slow", float, 1.0, "yarn: rotations below which frequencies are divided by "
        "factor", gt=0.0, written="changed"),
    Arg("mscale", float, 0.0, "yarn: DeepSeek's mscale (0: none)", ge=0.0, written="changed"),
    Arg("mscale_all_dim", float, 0.0, "yarn: DeepSeek's mscale_all_dim, which also scales "
        "the softmax by mscale(factor, mscale_all_dim)² (0: none)", ge=0.0, written="changed"),
    Arg("attention_factor", float, 0.0, "yarn: what cos and sin are multiplied by (0: from "
        "factor, mscale and mscale_all_dim)", ge=0.0, written="changed"),
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
            # documents: attends within each document (its own operator, not the attn kernel).
            features=frozenset({"compile", "mask", "documents"}),
        )
    ]
