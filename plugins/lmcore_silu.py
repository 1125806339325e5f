"""ffn=silu: the ungated SiLU feed-forward network `w2(silu(w1 x))`, CS336 §7's SwiGLU ablation.

The default `d_ff = 4·d_model` makes its two matrices hold about as many parameters as SwiGLU's
three at `8/3·d_model`, so the ablation compares gating, not size.
"""

from __future__ import annotations

import torch

from lmcore import Component, hookimpl
from lmcore.nn import FeedForward, feed_forward_activations, silu


def SiLUFeedForward(
    d_model: int,
    d_ff: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> FeedForward:
    """`w2(silu(w1 x))` with `w1: (d_ff, d_model)` and `w2: (d_model, d_ff)`, keys as SwiGLU's."""
    return FeedForward(d_model, d_ff, silu, gated=False, device=device, dtype=dtype)


def default_d_ff(d_model: int) -> int:
    """4·d_model: two matrices of 4·d² match a gated FFN's three of 8/3·d²."""
    return 4 * d_model


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="ffn",
            name="silu",
            build=SiLUFeedForward,
            help="ungated SiLU FFN: w2(silu(w1 x)); d_ff defaults to 4·d_model",
            params=lambda d_model, d_ff: 2 * d_model * d_ff,
            flops=lambda d_model, d_ff, seq_len: 2 * 2 * seq_len * d_model * d_ff,
            activations=feed_forward_activations(activation_saves=2, gated=False),
            default_d_ff=default_d_ff,
            features=frozenset({"compile"}),
        )
    ]
