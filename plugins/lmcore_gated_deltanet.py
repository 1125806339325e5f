"""mixer=gated_deltanet: Qwen3-Next's gated DeltaNet, linear attention by the gated delta rule.

    q, k, v, z = in_proj_qkvz(x)            b, a = in_proj_ba(x)
    q, k, v = silu(conv(q, k, v))           causal, depthwise, `conv_size` taps
    q, k = q / |q|, k / |k|                 L2-normalised per head
    g = -exp(A_log) · softplus(a + dt_bias) β = sigmoid(b)
    o = gated_delta_rule(q, k, v, g, β)     lmcore.model.deltanet
    y = out_proj(norm(o) · silu(z))         RMSNorm per head, gated

Training and prefill run the chunked form, a decoding step the recurrent one. The decoding
state does not grow with the context: per sequence, a `(num_v_heads, head_k_dim, head_v_dim)`
matrix (float32 at least: it accumulates every token) and the convolution's last
`conv_size - 1` inputs. Qwen3-Next puts three such layers before each attention layer
(`mixer=gated_deltanet, mixer[3::4]=attention`). A left pad feeds the convolution a zero and
leaves the matrix as it was (no decay, β = 0), so padded prompts give what they give alone.

The parameters are those of transformers' `Qwen3NextGatedDeltaNet` under the same names and
shapes, so a checkpoint's `model.layers.{i}.linear_attn.*` load as `layers.{i}.attn.*`:
`in_proj_qkvz` (q, k, v, z grouped by key head: for each key head its q, k, then the v and z
of the `num_v_heads / num_k_heads` value heads it serves), `in_proj_ba` (b, a grouped the same
way), `conv1d.weight` `(channels, 1, conv_size)` over q, k, v (all heads of q, then k, then v),
`dt_bias`, `A_log` (num_v_heads each), `norm.weight` (head_v_dim), `out_proj`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import LayerContext
from lmcore.model.cache import RecurrentState
from lmcore.model.conv import DepthwiseConv
from lmcore.model.deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule
from lmcore.model.nn import Linear, at_least_float32, silu, softplus
from lmcore.model.roles import GAIN, SCALAR, Role, packed


class GatedRMSNorm(nn.Module):
    """`x / sqrt(mean(x²) + eps) · weight · silu(z)` over the last dimension, in float32 at
    least (Qwen3-Next's `Qwen3NextRMSNormGated`; `weight` starts at ones)."""

    def __init__(
        self,
        dim: int,
        eps: float,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(
        self, x: Float[Tensor, "... dim"], z: Float[Tensor, "... dim"]
    ) -> Float[Tensor, "... dim"]:
        wide = at_least_float32(z.dtype)
        x = x.to(wide)
        normed = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(wide) * silu(z.to(wide))).to(z.dtype)

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's gated DeltaNet layer (module docstring); state-dict keys `in_proj_qkvz`,
    `in_proj_ba`, `conv1d`, `dt_bias`, `A_log`, `norm`, `out_proj`, as transformers'."""

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        head_dim: int,
        num_k_heads: int = 0,
        num_v_heads: int = 0,
        head_k_dim: int = 0,
        head_v_dim: int = 0,
        conv_size: int = 4,
        chunk_size: int = 64,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        hk, hv, dk, dv = _dims(
            num_heads, head_dim, num_k_heads, num_v_heads, head_k_dim, head_v_dim
        )
        self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim = hk, hv, dk, dv
        self.conv_size, self.chunk_size = conv_size, chunk_size
        self.key_dim, self.value_dim = hk * dk, hv * dv
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        # Packed by key head: its q, its k, then the v and z of the value heads it serves (and
        # b, a likewise), each a logical matrix of its own (an optimizer that orthogonalises
        # matrices takes each separately).
        group = hv // hk
        self.in_proj_qkvz = Linear(
            d_model, 2 * self.key_dim + 2 * self.value_dim, **factory,
            role=packed(*[dk, dk, group * dv, group * dv] * hk),
        )  # fmt: skip
        self.in_proj_ba = Linear(d_model, 2 * hv, **factory, role=packed(*[group, group] * hk))
        self.conv1d = DepthwiseConv(
            2 * self.key_dim + self.value_dim, conv_size, bias=False, **factory
        )
        # Mamba-2's time-step init (as flash-linear-attention's GatedDeltaNet): dt log-uniform
        # in [1e-3, 1e-1], dt_bias its inverse softplus; A uniform in [0.01, 16] (transformers').
        dt = torch.empty(hv, **factory).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        dt = dt.clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.empty(hv, **factory).uniform_(0.01, 16).log())
        self.norm = GatedRMSNorm(dv, eps, **factory)
        self.out_proj = Linear(self.value_dim, d_model, **factory)

    def parameter_roles(self) -> dict[str, Role]:
        return {"dt_bias": SCALAR, "A_log": SCALAR}  # per value head

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        B, T, _ = x.shape
        hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        group = hv // hk
        # Qwen3-Next's layout: per key head, its q and k, then its value heads' v and z.
        qkvz = self.in_proj_qkvz(x).view(B, T, hk, 2 * dk + 2 * group * dv)
        q, k, v, z = qkvz.split([dk, dk, group * dv, group * dv], dim=-1)
        b, a = self.in_proj_ba(x).view(B, T, hk, 2 * group).split([group, group], dim=-1)
        mixed = torch.cat(
            [q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1
        )  # (B, T, 2 key_dim + value_dim): the convolution's channel order

        cache = context.cache
        valid = None if cache is None or cache.valid is None else cache.valid
        if valid is not None:  # a pad feeds the conv a zero, what a fresh sequence starts from
            mixed = mixed * valid[..., None].to(mixed.dtype)
        tail = None if cache is None or cache.start == 0 else cache.state["conv"]
        mixed, new_tail = self.conv1d(mixed, tail, context.documents)
        if cache is not None:
            cache.state["conv"].copy_(new_tail)  # in place: the storage never moves
        wide = at_least_float32(x.dtype)
        mixed = silu(mixed.to(wide))
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (_l2norm(t.reshape(B, T, hk, dk)) for t in (q, k))
        if group > 1:  # key head j serves value heads j·group … (j+1)·group - 1
            q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
        v = v.reshape(B, T, hv, dv)

        beta = torch.sigmoid(b.reshape(B, T, hv).to(wide))
        g = -self.A_log.to(wide).exp() * softplus(a.reshape(B, T, hv).to(wide) + self.dt_bias)
        if valid is not None:  # a pad neither decays nor writes the state
            keep = valid[..., None].to(wide)
            g, beta = g * keep, beta * keep

        state = None if cache is None or cache.start == 0 else cache.state["S"]
        if cache is not None and T == 1:
            o, final = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state)
        else:
            o, final = chunk_gated_delta_rule(
                q, k, v, g, beta, chunk_size=self.chunk_size, initial_state=state,
                documents=context.documents,
            )  # fmt: skip
        if cache is not None:
            cache.state["S"].copy_(final)
        y = self.norm(o, z.reshape(B, T, hv, dv))  # (B, T, hv, dv) in x's dtype
        out: Tensor = self.out_proj(y.reshape(B, T, self.value_dim))
        return out

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RecurrentState:
        """The delta rule's matrix per value head and the convolution's last inputs."""
        hv, dk, dv = self.num_v_heads, self.head_k_dim, self.head_v_dim
        S = torch.zeros(batch, hv, dk, dv, device=device, dtype=at_least_float32(dtype))
        channels = 2 * self.key_dim + self.value_dim
        tail = torch.zeros(batch, channels, self.conv_size - 1, device=device, dtype=dtype)
        return RecurrentState({"S": S, "conv": tail})

    def extra_repr(self) -> str:
        return (
            f"num_k_heads={self.num_k_heads}, num_v_heads={self.num_v_heads}, "
            f"head_k_dim={self.head_k_dim}, head_v_dim={self.head_v_dim}, "
            f"conv_size={self.conv_size}, chunk_size={self.chunk_size}"
        )


def _l2norm(x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
    """`x / sqrt(|x|² + 1e-6)`, as Qwen3-Next (and flash-linear-attention) normalise q and k."""
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) + 1e-6)


def _dims(
    num_heads: int, head_dim: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
    head_v_dim: int,
) -> tuple[int, int, int, int]:  # fmt: skip
    """(key heads, value heads, key dim, value dim), 0 meaning the model's heads / head_dim."""
    return (num_k_heads or num_heads, num_v_heads or num_heads, head_k_dim or head_dim,
            head_v_dim or head_dim)  # fmt: skip


def params(
    d_model: int, num_heads: int, head_dim: int, num_k_heads: int, num_v_heads: int,
    head_k_dim: int, head_v_dim: int, conv_size: int,
) -> int:  # fmt: skip
    hk, hv, dk, dv = _dims(num_heads, head_dim, num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    projections = d_model * (2 * hk * dk + 2 * hv * dv) + d_model * 2 * hv + hv * dv * d_model
    conv = (2 * hk * dk + hv * dv) * conv_size
    return projections + conv + 2 * hv + dv  # + dt_bias, A_log, norm.weight


def flops(
    d_model: int, num_heads: int, head_dim: int, num_k_heads: int, num_v_heads: int,
    head_k_dim: int, head_v_dim: int, chunk_size: int, seq_len: int,
) -> int:  # fmt: skip
    """The projections, and per value head and chunk of C tokens the chunked form's matmuls:
    k·kᵀ and q·kᵀ (C² d_k each), the inverse of the chunk's triangular system times β·v and
    the decayed β·k (C² d_v, C² d_k), the scores times the corrections (C² d_v), and three
    products with a `(d_k, d_v)` state or its update (C d_k d_v each)."""
    hk, hv, dk, dv = _dims(num_heads, head_dim, num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    T = seq_len
    projections = 2 * T * d_model * (2 * hk * dk + 2 * hv * dv + 2 * hv + hv * dv)
    C = max(1, min(chunk_size, T))
    chunks = -(-T // C)
    per_chunk = 2 * (3 * C * C * dk + 2 * C * C * dv + 3 * C * dk * dv)
    return projections + hv * chunks * per_chunk


def activations(
    batch: int, seq_len: int, d_model: int, num_heads: int, head_dim: int, num_k_heads: int,
    num_v_heads: int, head_k_dim: int, head_v_dim: int, conv_size: int, chunk_size: int,
    dtype: torch.dtype,
) -> int:  # fmt: skip
    """The distinct tensors the forward keeps for backward, in the model's dtype (s bytes) or
    the rule's (w bytes: float32 at least); per sequence of T tokens in N chunks of C (L = N·C
    padded tokens), with Cc = 2·Hk·dk + Hv·dv convolution channels."""
    hk, hv, dk, dv = _dims(num_heads, head_dim, num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    s, w = dtype.itemsize, at_least_float32(dtype).itemsize
    T, K = seq_len, conv_size
    C = max(1, min(chunk_size, T))
    N = -(-T // C)
    L = N * C
    channels = 2 * hk * dk + hv * dv
    # Projections and convolution: the input; the convolution's zero-led input; silu's input,
    # sigmoid and output; the two L2 norms' 1/|x| per key head.
    per_seq = T * d_model * s + (K - 1 + T) * channels * s + 3 * T * channels * w
    per_seq += 2 * T * hk * w
    # The gates: sigmoid(b); softplus's input, its exp and its output (-exp(A_log) is per
    # head, shared by the batch: below).
    per_seq += 4 * T * hv * w
    # z as silu(z) reads it: a view of in_proj_qkvz's output, or its own copy when it is
    # widened to w or several key heads each serve several value heads (no view reshapes it).
    view = w == s and (hk == hv or hk == 1)
    per_seq += T * (2 * hk * dk + 2 * hv * dv) * s if view else T * hv * dv * w
    # The gated norm: the rule's output (padded), 1/rms, the normalised, scaled and gated
    # products and silu(z)'s sigmoid; out_proj's input.
    per_seq += hv * L * dv * w + T * hv * w + 4 * T * hv * dv * w + T * hv * dv * s
    # The chunked rule, per value head. Without an initial state the first chunk's products
    # with the zero state need no saved operand; with one chunk, the state after it goes
    # unused and nothing only its update kept stays.
    more = int(N >= 2)
    rule = 6 * N * C * C  # D, k·kᵀ, A, its inverse, q·kᵀ, the scores
    rule += (3 + more) * L + more * N  # β, exp(γ) twice (+ the tail's decay, the chunks')
    rule += (4 + 3 * more) * L * dk  # k, β·k, decayed β·k, scaled q (+ W, the tail's k, q·e^γ)
    rule += 3 * L * dv + (N - 1) * C * dv  # v, β·v, U (+ each correction but the last)
    rule += 2 * N * dk * dv  # the state entering each chunk, and them stacked
    per_head = rule * w
    shared = C * C + (0 if w == s else dv * w) + 2 * hv * w  # mask, a widened norm.weight, A
    return batch * (per_seq + hv * per_head) + shared


def state(
    num_heads: int, head_dim: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
    head_v_dim: int, conv_size: int, dtype: torch.dtype,
) -> tuple[int, int]:  # fmt: skip
    hk, hv, dk, dv = _dims(num_heads, head_dim, num_k_heads, num_v_heads, head_k_dim, head_v_dim)
    matrix = hv * dk * dv * at_least_float32(dtype).itemsize
    tail = (2 * hk * dk + hv * dv) * (conv_size - 1) * dtype.itemsize
    return 0, matrix + tail


def _validate(
    num_heads: int, num_k_heads: int, num_v_heads: int, conv_size: int,
) -> None:  # fmt: skip
    hk, hv = num_k_heads or num_heads, num_v_heads or num_heads
    if hv % hk:
        raise ValueError(
            f"num_v_heads={hv} is not a multiple of num_k_heads={hk}: each key head serves "
            f"the same number of value heads; use num_v_heads a multiple of {hk} (Qwen3-Next: "
            "num_k_heads=16, num_v_heads=32)"
        )
    if conv_size < 2:
        raise ValueError(
            f"conv_size={conv_size}: the short convolution on q, k and v sees the token and at "
            "least the one before it; use conv_size >= 2 (Qwen3-Next: 4)"
        )


ARGS = (
    Arg("num_k_heads", int, 0, "query and key heads; 0: the model's num_heads", ge=0),
    Arg("num_v_heads", int, 0, "value heads (a multiple of num_k_heads); 0: num_heads", ge=0),
    Arg("head_k_dim", int, 0, "dimensions of a query or key head; 0: the model's head_dim",
        ge=0),
    Arg("head_v_dim", int, 0, "dimensions of a value head; 0: the model's head_dim", ge=0),
    Arg("conv_size", int, 4, "taps of the causal depthwise convolution on q, k, v (Qwen3-Next: "
        "4)", ge=1),
    Arg("chunk_size", int, 64, "tokens per chunk of the chunked (training, prefill) form",
        ge=1),
    Arg("eps", float, 1e-6, "added to mean(o²) in the gated output norm", gt=0.0),
)  # fmt: skip


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="gated_deltanet",
            build=GatedDeltaNet,
            args=ARGS,
            help="Qwen3-Next's gated DeltaNet: the gated delta rule, chunked for training and "
            "recurrent for decoding; a fixed-size state",
            params=params,
            flops=flops,
            activations=activations,
            buffers=lambda: 0,
            state=state,
            validate=_validate,
            # documents: the convolution and the delta rule's state restart at each document.
            features=frozenset({"compile", "mask", "documents"}),
        )
    ]
