"""The feed-forward family from one table, an entry point per row: swiglu, geglu, silu, gelu, relu.

Every row is a `lmcore.model.nn.FeedForward` with CS336's keys: ungated `w2(act(w1 x))`, or gated
(the GLU family, Shazeer 2020) `w2(act(w1 x) * w3 x)`, with `w1, w3: (d_ff, d_model)` and
`w2: (d_model, d_ff)`. The rows differ only in the activation, the gating and how many tensors
the activation keeps for backward. Every row takes `bias` (a bias on each of w1, w3 and w2, as in
GPT-2's and GPT-NeoX's MLPs) and `w1_scale`, `w2_scale` (constants multiplying w1 x and the
output: Falcon-H1's `mlp_multipliers`); the GELU rows take `approximate=tanh`, the tanh approximation
(GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`).

Widths: a gated row defaults to `d_ff = 8/3·d_model` rounded to a multiple of 64; an ungated row
declares no default and gets lmcore's `4·d_model`, so its two matrices hold about as many
parameters as a gated row's three and an ablation compares the gating, not the size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final

import torch
from torch import Tensor

from lmcore import Arg, Component, hookimpl
from lmcore.model import nn as ops
from lmcore.model.nn import Derivative, FeedForward, feed_forward_activations, gated_d_ff

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
