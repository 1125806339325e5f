"""mixer=short_conv: LFM2's gated short convolution, a token mixer with no attention.

    b, c, h = in_proj(x)                      three d_model-wide parts
    y = out_proj(c · conv(b · h))             conv: causal, depthwise, `conv_size` taps

Each token sees the `conv_size - 1` before it and nothing further, so decoding keeps only
their gated inputs, `(d_model, conv_size - 1)` per sequence, whatever the context: the state
does not grow. LFM2 puts such layers between its attention layers
(`mixer=attention, mixer[0::2]=short_conv` and the like). A left pad contributes a zero input
to the convolution, what a fresh sequence starts from, so padded prompts give what they give
alone.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import LayerContext
from lmcore.model.cache import RecurrentState
from lmcore.model.conv import causal_conv
from lmcore.model.nn import Linear
from lmcore.model.roles import BIAS, CONV, Role, packed


class ShortConv(nn.Module):
    """`out_proj(c · conv(b · h))` with `b, c, h = in_proj(x)`; the convolution's weight is
    `(d_model, conv_size)`, one filter per channel (LFM2's `conv.weight` without its middle
    axis). State-dict keys: in_proj, conv_weight, out_proj; with `bias` (LFM2's `conv_bias`)
    their biases and the convolution's, conv_bias."""

    def __init__(
        self,
        *,
        d_model: int,
        conv_size: int = 3,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.d_model, self.conv_size = d_model, conv_size
        self.in_proj = Linear(
            d_model, 3 * d_model, device=device, dtype=dtype, bias=bias,
            role=packed(d_model, d_model, d_model),  # b, c and h
        )  # fmt: skip
        # Uniform in ±1/sqrt(conv_size), as torch initialises a depthwise convolution's filter.
        bound = conv_size**-0.5
        self.conv_weight = nn.Parameter(
            torch.empty(d_model, conv_size, device=device, dtype=dtype).uniform_(-bound, bound)
        )
        self.conv_bias = (
            nn.Parameter(torch.empty(d_model, device=device, dtype=dtype).uniform_(-bound, bound))
            if bias
            else None
        )
        self.out_proj = Linear(d_model, d_model, device=device, dtype=dtype, bias=bias)

    def parameter_roles(self) -> dict[str, Role]:
        return {"conv_weight": CONV, "conv_bias": BIAS}

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        b, c, h = self.in_proj(x).chunk(3, dim=-1)  # (B, T, d) each, views
        gated = b * h
        cache = context.cache
        if cache is not None and cache.valid is not None:  # a pad feeds the conv a zero
            gated = gated * cache.valid[..., None].to(gated.dtype)
        tail = None if cache is None or cache.start == 0 else cache.state["conv"]
        mixed, new_tail = causal_conv(
            gated, self.conv_weight, self.conv_bias, tail, context.documents
        )
        if cache is not None:
            cache.state["conv"].copy_(new_tail)  # in place: the storage never moves
        y: Tensor = self.out_proj(c * mixed)
        return y

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> RecurrentState:
        """The last `conv_size - 1` gated inputs of each sequence."""
        tail = torch.zeros(batch, self.d_model, self.conv_size - 1, device=device, dtype=dtype)
        return RecurrentState({"conv": tail})

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, conv_size={self.conv_size}"


def params(d_model: int, conv_size: int, bias: bool) -> int:
    return 4 * d_model * d_model + d_model * conv_size + (5 * d_model if bias else 0)


def flops(d_model: int, seq_len: int) -> int:
    return 2 * seq_len * d_model * 4 * d_model  # in_proj (d -> 3d) and out_proj (d -> d)


def activations(batch: int, seq_len: int, d_model: int, conv_size: int, dtype: torch.dtype) -> int:
    """Kept for backward: the input (in_proj's), in_proj's output (b, c and h are views of
    it), the convolution's zero-led input, its output and out_proj's input."""
    return batch * d_model * (7 * seq_len + conv_size - 1) * dtype.itemsize


def state(d_model: int, conv_size: int, dtype: torch.dtype) -> tuple[int, int]:
    return 0, d_model * (conv_size - 1) * dtype.itemsize


def _validate(conv_size: int) -> None:
    if conv_size < 2:
        raise ValueError(
            f"conv_size={conv_size}: a short convolution sees the token and at least the one "
            "before it; use conv_size >= 2 (LFM2: 3)"
        )


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="short_conv",
            build=ShortConv,
            args=(
                Arg("conv_size", int, 3, "taps of the causal depthwise convolution (LFM2: 3)",
                    ge=1),
                Arg("bias", bool, False, "biases on in_proj, the convolution and out_proj "
                    "(LFM2's conv_bias)"),
            ),  # fmt: skip
            help="LFM2's gated short convolution: out(c · conv(b · h)); a fixed-size state",
            params=params,
            flops=flops,
            activations=activations,
            buffers=lambda: 0,
            state=state,
            validate=_validate,
            # documents: a tap into an earlier document reads a zero (a fresh sequence's).
            features=frozenset({"compile", "mask", "documents"}),
        )
    ]
