"""mixer=mamba2: Mamba-2's selective state space layer (Dao & Gu 2024), by state space duality.

    z, xBC, dt = in_proj(x)                 I = expand · d_model; xBC: x (I), B, C (G·N each)
    x, B, C = silu(conv(xBC))               causal, depthwise, `conv_size` taps
    dt = softplus(dt + dt_bias)             A = -exp(A_log), one each per head
    y = ssd(x, dt, A, B, C) + D · x         lmcore.model.ssd, heads of `head_dim`
    out = out_proj(norm(y · silu(z)))       RMSNorm per group of I / G channels, gated first

Training and prefill run the chunked form, a decoding step the recurrent one. The decoding
state does not grow with the context: per sequence, a `(heads, head_dim, d_state)` state
(float32 at least: it accumulates every token) and the convolution's last `conv_size - 1`
inputs. A left pad feeds the convolution a zero and gets dt = 0 (no decay, nothing written),
so padded prompts give what they give alone.

Falcon-H1's Mamba-2 (`FalconH1Mixer`) adds arguments Mamba-2's specs leave out: `d_inner` (I
itself), `out_bias` (out_proj's bias apart from in_proj's), `gate_norm` (the norm after the gate,
`norm_first`, or no norm, `none`) and `z_multiplier` … `dt_multiplier` (in_proj's five outputs
each times a constant, its `ssm_multipliers`).

The parameters are those of transformers' `Mamba2Mixer` under the same names and shapes, so a
checkpoint's `backbone.layers.{i}.mixer.*` load as `layers.{i}.attn.*`: `in_proj` (z, then x,
B, C, then dt), `conv1d.weight` `(I + 2·G·N, 1, conv_size)` and `conv1d.bias`, `dt_bias`,
`A_log`, `D` (heads each), `norm.weight` (I), `out_proj`.
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
from lmcore.model.nn import Linear, at_least_float32, silu, softplus
from lmcore.model.roles import GAIN, SCALAR, Role, packed
from lmcore.model.ssd import chunk_ssd, recurrent_ssd

# Where the output gate silu(z) applies: before the norm (Mamba-2's `MambaRMSNormGated`), after
# it (Falcon-H1's `mamba_norm_before_gate`), or with no norm at all (`mamba_rms_norm: false`).
GATE_NORMS = ("gate_first", "norm_first", "none")


class GatedRMSNorm(nn.Module):
    """`rmsnorm(x · silu(z)) · weight` per group of `dim / groups` channels, in float32 at least
    (Mamba-2's `MambaRMSNormGated`, the gate before the norm; `weight` starts at ones); with
    `order="norm_first"`, `rmsnorm(x) · weight · silu(z)` (Falcon-H1's norm before the gate)."""

    def __init__(
        self,
        dim: int,
        groups: int,
        eps: float,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        order: str = "gate_first",
    ):
        super().__init__()
        self.groups, self.eps, self.order = groups, eps, order
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(
        self, x: Float[Tensor, "... dim"], z: Float[Tensor, "... dim"]
    ) -> Float[Tensor, "... dim"]:
        wide = at_least_float32(x.dtype)
        first = self.order == "gate_first"
        gated = x.to(wide) * silu(z.to(wide)) if first else x.to(wide)
        grouped = gated.unflatten(-1, (self.groups, -1))
        normed = grouped * torch.rsqrt(grouped.square().mean(dim=-1, keepdim=True) + self.eps)
        out = normed.flatten(-2) * self.weight.to(wide)
        return out if first else out * silu(z.to(wide))

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}


class Gate(nn.Module):
    """`x · silu(z)` in float32 at least, no norm (Falcon-H1's `mamba_rms_norm: false`)."""

    def forward(
        self, x: Float[Tensor, "... dim"], z: Float[Tensor, "... dim"]
    ) -> Float[Tensor, "... dim"]:
        wide = at_least_float32(x.dtype)
        return x.to(wide) * silu(z.to(wide))


class Mamba2(nn.Module):
    """Mamba-2's layer (module docstring), built from flat keyword arguments: `head_dim` here is
    the SSM head's size (heads = expand · d_model / head_dim). State-dict keys `in_proj`,
    `conv1d`, `dt_bias`, `A_log`, `D`, `norm`, `out_proj`, as transformers' `Mamba2Mixer`."""

    def __init__(
        self,
        *,
        d_model: int,
        d_state: int = 128,
        expand: int = 2,
        head_dim: int = 64,
        n_groups: int = 1,
        conv_size: int = 4,
        chunk_size: int = 256,
        conv_bias: bool = True,
        bias: bool = False,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        d_inner: int = 0,
        out_bias: str = "same",
        gate_norm: str = "gate_first",
        multipliers: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 1.0, 1.0),
    ):
        super().__init__()
        check(d_model, expand, head_dim, n_groups, d_inner)
        self.d_model, self.d_state = d_model, d_state
        self.head_dim, self.n_groups = head_dim, n_groups
        self.conv_size, self.chunk_size = conv_size, chunk_size
        self.inner = inner_width(d_model, expand, d_inner)
        self.num_heads = self.inner // head_dim
        self.conv_dim = self.inner + 2 * n_groups * d_state
        # Falcon-H1's ssm_multipliers: z, x, B, C and dt as in_proj gives them, each scaled.
        self.multipliers = tuple(float(m) for m in multipliers)
        H = self.num_heads
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        # z, x, B, C and dt: five logical matrices in one.
        BC = n_groups * d_state
        self.in_proj = Linear(
            d_model, self.inner + self.conv_dim + H, bias=bias, **factory,
            role=packed(self.inner, self.inner, BC, BC, H),
        )  # fmt: skip
        self.conv1d = DepthwiseConv(self.conv_dim, conv_size, conv_bias, **factory)
        # transformers' initialisation: dt log-uniform in [1e-3, 1e-1] (at least 1e-4), dt_bias
        # its inverse softplus; A = 1 … H; D = 1.
        dt = torch.empty(H, **factory).uniform_(math.log(1e-3), math.log(1e-1)).exp()
        dt = dt.clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.arange(1, H + 1, **factory).log())
        self.D = nn.Parameter(torch.ones(H, **factory))
        self.norm = (
            Gate() if gate_norm == "none"
            else GatedRMSNorm(self.inner, n_groups, eps, order=gate_norm, **factory)
        )  # fmt: skip
        self.out_proj = Linear(self.inner, d_model, bias=has_out_bias(bias, out_bias), **factory)

    def parameter_roles(self) -> dict[str, Role]:
        return {"dt_bias": SCALAR, "A_log": SCALAR, "D": SCALAR}  # per head

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        B, T, _ = x.shape
        H, P, G, N = self.num_heads, self.head_dim, self.n_groups, self.d_state
        z, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, H], dim=-1)
        if self.multipliers != (1.0, 1.0, 1.0, 1.0, 1.0):
            z, xbc, dt = self.scaled(z, xbc, dt)

        cache = context.cache
        valid = None if cache is None or cache.valid is None else cache.valid
        if valid is not None:  # a pad feeds the conv a zero, what a fresh sequence starts from
            xbc = xbc * valid[..., None].to(xbc.dtype)
        tail = None if cache is None or cache.start == 0 else cache.state["conv"]
        xbc, new_tail = self.conv1d(xbc, tail, context.documents)
        if cache is not None:
            cache.state["conv"].copy_(new_tail)  # in place: the storage never moves
        wide = at_least_float32(x.dtype)
        xbc = silu(xbc.to(wide))
        xs, b, c = xbc.split([self.inner, G * N, G * N], dim=-1)
        dt = softplus(dt.to(wide) + self.dt_bias.to(wide))
        if valid is not None:  # a pad neither decays nor writes the state
            dt = dt * valid[..., None].to(wide)
        A = -self.A_log.to(wide).exp()
        args = (xs.reshape(B, T, H, P), dt, A, b.reshape(B, T, G, N), c.reshape(B, T, G, N))

        state = None if cache is None or cache.start == 0 else cache.state["ssm"]
        if cache is not None and T == 1:
            y, final = recurrent_ssd(*args, D=self.D.to(wide), initial_state=state)
        else:
            y, final = chunk_ssd(
                *args, D=self.D.to(wide), chunk_size=self.chunk_size, initial_state=state,
                documents=context.documents,
            )  # fmt: skip
        if cache is not None:
            cache.state["ssm"].copy_(final)
        y = self.norm(y.reshape(B, T, self.inner), z)
        out: Tensor = self.out_proj(y.to(x.dtype))
        return out

    def scaled(
        self, z: Tensor, xbc: Tensor, dt: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """in_proj's z, x, B, C and dt each times its multiplier (Falcon-H1's mup vector)."""
        mz, mx, mb, mc, mdt = self.multipliers
        G, N = self.n_groups, self.d_state
        xs, b, c = xbc.split([self.inner, G * N, G * N], dim=-1)
        return z * mz, torch.cat((xs * mx, b * mb, c * mc), dim=-1), dt * mdt

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RecurrentState:
        """The SSM state per head and the convolution's last inputs."""
        H, P, N = self.num_heads, self.head_dim, self.d_state
        ssm = torch.zeros(batch, H, P, N, device=device, dtype=at_least_float32(dtype))
        tail = torch.zeros(batch, self.conv_dim, self.conv_size - 1, device=device, dtype=dtype)
        return RecurrentState({"ssm": ssm, "conv": tail})

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, d_state={self.d_state}, "
            f"n_groups={self.n_groups}, conv_size={self.conv_size}, chunk_size={self.chunk_size}"
        )


def inner_width(d_model: int, expand: int, d_inner: int = 0) -> int:
    """I: `d_inner`, or `expand · d_model` when it is 0."""
    return d_inner or expand * d_model


def has_out_bias(bias: bool, out_bias: str) -> bool:
    """Whether out_proj has a bias: in_proj's (`same`, Mamba-2's use_bias), or `on` / `off`."""
    return bias if out_bias == "same" else out_bias == "on"


def check(d_model: int, expand: int, head_dim: int, n_groups: int, d_inner: int = 0) -> None:
    """ValueError naming the values when the heads or groups cannot split the inner width."""
    inner = inner_width(d_model, expand, d_inner)
    width = f"d_inner = {inner}" if d_inner else f"expand · d_model = {expand} · {d_model} = {inner}"
    if head_dim < 1 or inner % head_dim:
        raise ValueError(
            f"ssm_head_dim={head_dim} does not divide {width}: the SSM heads split the inner "
            f"width evenly; use a divisor of {inner} (Mamba-2: 64)"
        )
    heads = inner // head_dim
    if n_groups < 1 or heads % n_groups:
        raise ValueError(
            f"n_groups={n_groups} does not divide the {heads} SSM heads ({width.split(' = ')[0]}"
            f" / ssm_head_dim = {inner} / {head_dim}): each group of B and C serves as many "
            f"heads; use a divisor of {heads} (Mamba-2: 1)"
        )


def _head(head_dim: int, ssm_head_dim: int) -> int:
    return ssm_head_dim or head_dim


def build(
    *,
    d_model: int,
    head_dim: int,
    d_state: int = 128,
    expand: int = 2,
    ssm_head_dim: int = 0,
    n_groups: int = 1,
    conv_size: int = 4,
    chunk_size: int = 256,
    conv_bias: bool = True,
    bias: bool = False,
    eps: float = 1e-5,
    d_inner: int = 0,
    out_bias: str = "same",
    gate_norm: str = "gate_first",
    z_multiplier: float = 1.0,
    x_multiplier: float = 1.0,
    b_multiplier: float = 1.0,
    c_multiplier: float = 1.0,
    dt_multiplier: float = 1.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Mamba2:
    """The registry's factory: the model's `head_dim` is the SSM head's unless `ssm_head_dim`."""
    return Mamba2(
        d_model=d_model, d_state=d_state, expand=expand, head_dim=_head(head_dim, ssm_head_dim),
        n_groups=n_groups, conv_size=conv_size, chunk_size=chunk_size, conv_bias=conv_bias,
        bias=bias, eps=eps, device=device, dtype=dtype, d_inner=d_inner, out_bias=out_bias,
        gate_norm=gate_norm,
        multipliers=(z_multiplier, x_multiplier, b_multiplier, c_multiplier, dt_multiplier),
    )  # fmt: skip


def params(
    d_model: int, head_dim: int, d_state: int, expand: int, ssm_head_dim: int, n_groups: int,
    conv_size: int, conv_bias: bool, bias: bool, d_inner: int = 0, out_bias: str = "same",
    gate_norm: str = "gate_first",
) -> int:  # fmt: skip
    inner, P = inner_width(d_model, expand, d_inner), _head(head_dim, ssm_head_dim)
    H, conv_dim = inner // P, inner + 2 * n_groups * d_state
    in_proj = (d_model + int(bias)) * (inner + conv_dim + H)
    out_proj = (inner + int(has_out_bias(bias, out_bias))) * d_model
    conv = conv_dim * (conv_size + int(conv_bias))
    norm = 0 if gate_norm == "none" else inner  # norm.weight
    return in_proj + conv + 3 * H + norm + out_proj  # + dt_bias, A_log, D


def flops(
    d_model: int, head_dim: int, d_state: int, expand: int, ssm_head_dim: int, n_groups: int,
    chunk_size: int, seq_len: int, d_inner: int = 0,
) -> int:  # fmt: skip
    """The projections, and per head and chunk of C tokens the chunked form's matmuls: C·Bᵀ
    (C² N), its product with dt·X (C² P), what the chunk writes to the state and what the
    state entering it gives (C P N each)."""
    inner, P = inner_width(d_model, expand, d_inner), _head(head_dim, ssm_head_dim)
    N, T = d_state, seq_len
    H, conv_dim = inner // P, inner + 2 * n_groups * d_state
    projections = 2 * T * d_model * (inner + conv_dim + H + inner)
    C = max(1, min(chunk_size, T))
    chunks = -(-T // C)
    return projections + H * chunks * 2 * (C * C * N + C * C * P + 2 * C * P * N)


def activations(
    batch: int, seq_len: int, d_model: int, head_dim: int, d_state: int, expand: int,
    ssm_head_dim: int, n_groups: int, conv_size: int, chunk_size: int, dtype: torch.dtype,
    d_inner: int = 0, gate_norm: str = "gate_first", z_multiplier: float = 1.0,
) -> int:  # fmt: skip
    """The distinct tensors the forward keeps for backward, in the model's dtype (s bytes) or
    the scan's (w bytes: float32 at least); per sequence of T tokens in M chunks of C (L = M·C
    padded tokens), with Cc = I + 2·G·N convolution channels."""
    inner, P, N, T, K, G = inner_width(d_model, expand, d_inner), _head(head_dim, ssm_head_dim), \
        d_state, seq_len, conv_size, n_groups  # fmt: skip
    H, channels = inner // P, inner + 2 * n_groups * d_state
    s, w = dtype.itemsize, at_least_float32(dtype).itemsize
    C = max(1, min(chunk_size, T))
    M = -(-T // C)
    L = M * C
    # in_proj's input; the convolution's zero-led input; silu's input, sigmoid and output (x, B,
    # C are views of it); softplus's input, its exp and its output dt.
    per_seq = T * d_model * s + (K - 1 + T) * channels * s + 3 * T * channels * w
    per_seq += 3 * T * H * w
    # z as silu(z) reads it: a view of in_proj's output, or its own copy when widened to w.
    # Scaled (z_multiplier), z is a tensor of its own.
    whole = T * (inner + channels + H) * s if z_multiplier == 1.0 else T * inner * s
    per_seq += whole if w == s else T * inner * w
    if gate_norm == "none":  # silu(z)'s sigmoid and output, the scan's output
        per_seq += 3 * T * inner * w + T * inner * s
    else:  # silu(z)'s sigmoid and output, the scan's output, the gated product (or the normed
        # times its gain), 1/rms per group, the normalised; out_proj's input.
        per_seq += 5 * T * inner * w + T * G * w + T * inner * s
    # The chunked scan, per head: dt·x (padded); L, C·Bᵀ and the scores (C² each per chunk);
    # the decays from the chunk's start and to its end, the chunks'; B and C per head, B and C
    # decayed; the states entering the chunks (each but the first, and them stacked). With one
    # chunk, the state after it goes unused and nothing only its update kept stays.
    more = int(M >= 2)
    scan = L * P + 3 * M * C * C + (1 + more) * L + more * M + (2 + 2 * more) * L * N
    scan += (2 * M - 1) * P * N
    gain = 0 if gate_norm == "none" else inner
    shared = C * C + 2 * H * w + (0 if w == s else (H + gain) * w)  # mask, A; widened D, norm
    return batch * (per_seq + H * scan * w) + shared


def state(
    d_model: int, head_dim: int, d_state: int, expand: int, ssm_head_dim: int, n_groups: int,
    conv_size: int, dtype: torch.dtype, d_inner: int = 0,
) -> tuple[int, int]:  # fmt: skip
    inner = inner_width(d_model, expand, d_inner)
    ssm = inner * d_state * at_least_float32(dtype).itemsize  # heads · head_dim = inner
    tail = (inner + 2 * n_groups * d_state) * (conv_size - 1) * dtype.itemsize
    return 0, ssm + tail


def validate(
    d_model: int, head_dim: int, expand: int, ssm_head_dim: int, n_groups: int, d_inner: int = 0
) -> None:
    check(d_model, expand, _head(head_dim, ssm_head_dim), n_groups, d_inner)


ARGS = (
    Arg("d_state", int, 128, "N: the state's size per head channel (Mamba-2: 128)", ge=1),
    Arg("expand", int, 2, "inner width I = expand · d_model (Mamba-2: 2)", ge=1),
    Arg("ssm_head_dim", int, 0, "P: channels of an SSM head (heads = I / P; Mamba-2: 64); 0: the "
        "model's head_dim", ge=0),
    Arg("n_groups", int, 1, "groups of B and C, each shared by heads / n_groups heads", ge=1),
    Arg("conv_size", int, 4, "taps of the causal depthwise convolution on x, B, C (Mamba-2: 4)",
        ge=1),
    Arg("chunk_size", int, 256, "tokens per chunk of the chunked (training, prefill) form",
        ge=1),
    Arg("conv_bias", bool, True, "the convolution's bias (transformers' use_conv_bias)"),
    Arg("bias", bool, False, "in_proj's and out_proj's biases (transformers' use_bias)"),
    Arg("eps", float, 1e-5, "added to mean(y²) in the gated output norm", gt=0.0),
    # Falcon-H1's Mamba-2 (written only when not the default, so Mamba-2's specs stay as they were).
    Arg("d_inner", int, 0, "I, the inner width (Falcon-H1's mamba_d_ssm); 0: expand · d_model",
        ge=0, written="changed"),
    Arg("out_bias", str, "same", "out_proj's bias: same as in_proj's (bias), on or off "
        "(Falcon-H1's projectors_bias)", choices=("same", "on", "off"), written="changed"),
    Arg("gate_norm", str, "gate_first", "the output gate silu(z): gate_first (rmsnorm(y · "
        "silu(z)), Mamba-2), norm_first (rmsnorm(y) · silu(z)) or none (y · silu(z), no norm)",
        choices=GATE_NORMS, written="changed"),
    *(Arg(f"{part}_multiplier", float, 1.0, f"multiplies in_proj's {part} (Falcon-H1's "
          f"ssm_multipliers[{i}])", written="changed")
      for i, part in enumerate(("z", "x", "b", "c", "dt"))),
)  # fmt: skip


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="mamba2",
            build=build,
            args=ARGS,
            help="Mamba-2's selective state space layer (SSD), chunked for training and "
            "recurrent for decoding; a fixed-size state",
            params=params,
            flops=flops,
            activations=activations,
            buffers=lambda: 0,
            state=state,
            validate=validate,
            # documents: the convolution and the SSM state restart at each document.
            features=frozenset({"compile", "mask", "documents"}),
        )
    ]
