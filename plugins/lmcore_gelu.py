"""ffn=gelu: the ungated GELU feed-forward network `w2(gelu(w1 x))` of GPT-2 and BERT, no biases.

GELU is the exact one, `x · Φ(x)` with the normal CDF written via erf (Hendrycks & Gimpel, 2016),
not the tanh approximation.
"""

from __future__ import annotations

import torch

from lmcore import Component, hookimpl
from lmcore.nn import FeedForward, feed_forward_activations, gelu


def GELUFeedForward(
    d_model: int,
    d_ff: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> FeedForward:
    """`w2(gelu(w1 x))` with `w1: (d_ff, d_model)` and `w2: (d_model, d_ff)`, keys as SwiGLU's."""
    return FeedForward(d_model, d_ff, gelu, gated=False, device=device, dtype=dtype)


def default_d_ff(d_model: int) -> int:
    """4·d_model: two matrices of 4·d² match a gated FFN's three of 8/3·d²."""
    return 4 * d_model


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="ffn",
            name="gelu",
            build=GELUFeedForward,
            help="ungated GELU FFN: w2(gelu(w1 x)); d_ff defaults to 4·d_model",
            params=lambda d_model, d_ff: 2 * d_model * d_ff,
            flops=lambda d_model, d_ff, seq_len: 2 * 2 * seq_len * d_model * d_ff,
            activations=feed_forward_activations(activation_saves=3, gated=False),
            default_d_ff=default_d_ff,
            features=frozenset({"compile"}),
        )
    ]
