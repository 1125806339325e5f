"""The feed-forward family from one table, an entry point per row: swiglu, geglu, silu, gelu, relu.

Every row is a `lmcore.model.nn.FeedForward` with CS336's keys: ungated `w2(act(w1 x))`, or gated
(the GLU family, Shazeer 2020) `w2(act(w1 x) * w3 x)`, with `w1, w3: (d_ff, d_model)` and
`w2: (d_model, d_ff)`. The rows differ only in the activation, the gating and how many tensors
the activation keeps for backward. Every row takes `bias` (a bias on each of w1, w3 and w2, as in
GPT-2's and GPT-NeoX's MLPs) and `w1_scale`, `w2_scale` (constants multiplying w1 x and the
output: Falcon-H1's `mlp_multipliers`); the GELU rows take `approximate=tanh`, the tanh approximation
(GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`).

`clamped_swiglu(alpha=1.702, limit=7.0, bias=false)` (gpt-oss's experts, its own module below):
`w2((clamp(w3 x, -limit, limit) + 1) · g · sigmoid(alpha · g))` with `g = min(w1 x, limit)`.

Widths: a gated row defaults to `d_ff = 8/3·d_model` rounded to a multiple of 64; an ungated row
declares no default and gets lmcore's `4·d_model`, so its two matrices hold about as many
parameters as a gated row's three and an ablation compares the gating, not the size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.model import nn as ops
from lmcore.model.nn import (
    Derivative,
    FeedForward,
    Linear,
    feed_forward_activations,
    gated_d_ff,
)

# The tanh approximation: its activation and derivative, fused so the FFN keeps only its input.
TANH: Final = (ops.gelu_tanh, ops.gelu_tanh_derivative)


@dataclass(frozen=True)
class Row:
    name: str
    activation: Callable[[Tensor], Tensor]
    gated: bool
    # (..., d_ff) tensors the activation keeps besides its output: silu its input and the
    # sigmoid, gelu x/√2, x/2 and 1 + erf, relu none (it keeps its output, which w2 keeps anyway).
    activation_saves: int
    help: str
    # The activation and its derivative together: a gated row then gates with
    # `lmcore.model.nn.gate`, which keeps only w1 x and w3 x for backward.
    derivative: Derivative | None = None
    # Whether the row takes `approximate=tanh` (the GELU rows).
    tanh: bool = False


TABLE: tuple[Row, ...] = (
    Row("swiglu", ops.silu, True, 2, "gated SiLU FFN: w2(silu(w1 x) * w3 x)", ops.silu_derivative),
    Row(
        "geglu",
        ops.gelu,
        True,
        3,
        "gated GELU FFN: w2(gelu(w1 x) * w3 x)",
        ops.gelu_derivative,
        tanh=True,
    ),
    Row("silu", ops.silu, False, 2, "ungated SiLU FFN: w2(silu(w1 x)); d_ff defaults to 4·d_model"),
    Row(
        "gelu",
        ops.gelu,
        False,
        3,
        "ungated GELU FFN: w2(gelu(w1 x)); d_ff defaults to 4·d_model",
        tanh=True,
    ),
    Row(
        "relu", torch.relu, False, 0, "ungated ReLU FFN: w2(relu(w1 x)); d_ff defaults to 4·d_model"
    ),
)


def build(
    row: Row,
    d_model: int,
    d_ff: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    bias: bool = False,
    approximate: str = "none",
    w1_scale: float = 1.0,
    w2_scale: float = 1.0,
) -> FeedForward:
    activation, derivative = (row.activation, row.derivative)
    if approximate == "tanh":
        activation, derivative = TANH
    return FeedForward(
        d_model,
        d_ff,
        activation,
        gated=row.gated,
        derivative=derivative,
        bias=bias,
        device=device,
        dtype=dtype,
        w1_scale=w1_scale,
        w2_scale=w2_scale,
    )


def args(row: Row) -> tuple[Arg, ...]:
    """What a row's spec takes: `bias` always, `approximate` for the GELU rows."""
    found = [Arg("bias", bool, False, "learn a bias on each of w1, w3 and w2", written="changed")]
    if row.tanh:
        found.append(
            Arg(
                "approximate",
                str,
                "none",
                "none: the exact erf GELU; tanh: its tanh approximation",
                choices=("none", "tanh"),
                written="changed",
            )
        )
    # Falcon-H1's mlp_multipliers (a product with a constant keeps nothing for backward).
    found += [
        Arg("w1_scale", float, 1.0, "multiplies w1 x, the activation's input", written="changed"),
        Arg("w2_scale", float, 1.0, "multiplies the output, w2's", written="changed"),
    ]
    return tuple(found)


def params(row: Row, d_model: int, d_ff: int, bias: bool = False) -> int:
    matrices = 3 if row.gated else 2
    biases = (matrices - 1) * d_ff + d_model if bias else 0
    return matrices * d_model * d_ff + biases


class Plugin:
    """The plugin object one entry point names: the hook that declares its row's component."""

    def __init__(self, row: Row):
        self.row = row

    @hookimpl
    def lmcore_components(self) -> list[Component]:
        row, matrices = self.row, 3 if self.row.gated else 2
        exact = feed_forward_activations(
            activation_saves=row.activation_saves,
            gated=row.gated,
            fused_gate=row.derivative is not None,
        )
        fused = feed_forward_activations(
            activation_saves=1, gated=row.gated, fused_gate=True, fused_activation=True
        )

        def activations(
            batch: int, seq_len: int, d_model: int, d_ff: int, dtype: torch.dtype, **kw: object
        ) -> int:
            chosen = fused if kw.get("approximate") == "tanh" else exact
            return chosen(batch, seq_len, d_model, d_ff, dtype)

        return [
            Component(
                kind="ffn",
                name=row.name,
                build=partial(build, row),
                args=args(row),
                help=row.help,
                params=partial(params, row),
                flops=lambda d_model, d_ff, seq_len: matrices * 2 * seq_len * d_model * d_ff,
                activations=activations,
                default_d_ff=gated_d_ff if row.gated else None,
                modules=lambda: 1 + matrices,  # the layer and its Linears
                features=frozenset({"compile"}),
            )
        ]


ROWS = {row.name: row for row in TABLE}
# The objects the entry points name (`swiglu = "lmcore_ffn:swiglu"`), one per row.
swiglu, geglu, silu, gelu, relu = (Plugin(row) for row in TABLE)
# Module factories by name, e.g. `SwiGLU(d_model=64, d_ff=128)`, for direct use and tests.
SwiGLU = partial(build, ROWS["swiglu"])
GEGLU = partial(build, ROWS["geglu"])
SiLUFeedForward = partial(build, ROWS["silu"])
GELUFeedForward = partial(build, ROWS["gelu"])
ReLUFeedForward = partial(build, ROWS["relu"])


# ------------------------------------------------------------------------------ clamped SwiGLU


class _ClampedGate(torch.autograd.Function):
    """`(clamp(b, ±limit) + 1) · g · sigmoid(alpha · g)`, `g = min(a, limit)`, keeping only a
    and b: backward recomputes the clamps and the sigmoid (autograd through the formula keeps
    five more (…, d_ff) tensors). Clamps pass the gradient on their bounds, as torch's do."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, alpha: float, limit: float) -> Tensor:
        ctx.alpha, ctx.limit = alpha, limit
        ctx.save_for_backward(a, b)
        return clamped_gate(a, b, alpha, limit)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, b = ctx.saved_tensors
        alpha, limit = ctx.alpha, ctx.limit
        g = a.clamp(max=limit)
        sig = torch.sigmoid(g * alpha)
        glu = g * sig
        da = db = None
        if ctx.needs_input_grad[0]:
            up = b.clamp(-limit, limit) + 1
            slope = (1.0 - sig).mul_(glu).mul_(alpha).add_(sig)  # d(g σ(αg))/dg
            da = slope.mul_(up).mul_(grad).mul_(a <= limit)
        if ctx.needs_input_grad[1]:
            db = glu.mul_(grad).mul_((b >= -limit) & (b <= limit))
        return da, db, None, None


def clamped_gate(
    a: Float[Tensor, "... d_ff"], b: Float[Tensor, "... d_ff"], alpha: float, limit: float
) -> Float[Tensor, "... d_ff"]:
    """gpt-oss's gating of the gate `a` and the up projection `b`, in transformers' order of
    operations (so float32 rounds alike): `g = min(a, limit)`, `u = clamp(b, -limit, limit)`,
    `(u + 1) · (g · sigmoid(g · alpha))`."""
    g = a.clamp(max=limit)
    glu = g * torch.sigmoid(g * alpha)
    return (b.clamp(-limit, limit) + 1) * glu


class ClampedSwiGLU(nn.Module):
    """gpt-oss's expert: `w2(clamped_gate(w1 x, w3 x))` with CS336's keys (`w1` the gate, `w3`
    the up projection, `w2` down; `.bias` on each with `bias=True`, as gpt-oss has)."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        alpha: float = 1.702,
        limit: float = 7.0,
        bias: bool = False,
    ):
        super().__init__()
        self.alpha, self.limit = alpha, limit
        factory: dict[str, Any] = {"device": device, "dtype": dtype, "bias": bias}
        self.w1 = Linear(d_model, d_ff, **factory)
        self.w2 = Linear(d_ff, d_model, **factory)
        self.w3 = Linear(d_model, d_ff, **factory)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        a, b = self.w1(x), self.w3(x)
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            hidden = _ClampedGate.apply(a, b, self.alpha, self.limit)
        else:
            hidden = clamped_gate(a, b, self.alpha, self.limit)
        y: Tensor = self.w2(hidden)
        return y

    def extra_repr(self) -> str:
        bias = ", bias=True" if self.w1.bias is not None else ""
        return f"alpha={self.alpha}, limit={self.limit}{bias}"


CLAMPED: Final = "clamped_swiglu"
CLAMPED_ARGS: Final = (
    Arg("alpha", float, 1.702, "the sigmoid's gain: the gate is g · sigmoid(alpha · g)", gt=0.0),
    Arg("limit", float, 7.0, "the gate is clamped to at most limit, the up projection to ±limit",
        gt=0.0),
    Arg("bias", bool, False, "learn a bias on each of w1, w3 and w2 (gpt-oss has them)"),
)  # fmt: skip


class ClampedPlugin:
    """The plugin object of `clamped_swiglu`."""

    @hookimpl
    def lmcore_components(self) -> list[Component]:
        return [
            Component(
                kind="ffn",
                name=CLAMPED,
                build=ClampedSwiGLU,
                args=CLAMPED_ARGS,
                help="gpt-oss's clamped SwiGLU: w2((clamp(w3 x, ±l) + 1) · g·sigmoid(alpha·g)), "
                "g = min(w1 x, l)",
                params=partial(params, ROWS["swiglu"]),
                flops=lambda d_model, d_ff, seq_len: 3 * 2 * seq_len * d_model * d_ff,
                # its input, w1 x and w3 x (kept by the fused gate) and the product w2 reads
                activations=feed_forward_activations(
                    activation_saves=0, gated=True, fused_gate=True
                ),
                default_d_ff=gated_d_ff,
                modules=lambda: 4,  # the layer and its three Linears
                features=frozenset({"compile"}),
            )
        ]


# The object the entry point names: `clamped_swiglu = "lmcore_ffn:clamped_swiglu"`.
clamped_swiglu = ClampedPlugin()
