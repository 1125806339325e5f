"""ffn=relu: the ungated ReLU feed-forward network `w2(relu(w1 x))` of Vaswani et al. (2017),
without biases.
"""

from __future__ import annotations

import torch

from lmcore import Component, hookimpl
from lmcore.nn import FeedForward, feed_forward_activations


def ReLUFeedForward(
    d_model: int,
    d_ff: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> FeedForward:
    """`w2(relu(w1 x))` with `w1: (d_ff, d_model)` and `w2: (d_model, d_ff)`, keys as SwiGLU's."""
    return FeedForward(d_model, d_ff, torch.relu, gated=False, device=device, dtype=dtype)


def default_d_ff(d_model: int) -> int:
    """4·d_model: two matrices of 4·d² match a gated FFN's three of 8/3·d²."""
    return 4 * d_model


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="ffn",
            name="relu",
            build=ReLUFeedForward,
            help="ungated ReLU FFN: w2(relu(w1 x)); d_ff defaults to 4·d_model",
            params=lambda d_model, d_ff: 2 * d_model * d_ff,
            flops=lambda d_model, d_ff, seq_len: 2 * 2 * seq_len * d_model * d_ff,
            activations=feed_forward_activations(activation_saves=0, gated=False),
            default_d_ff=default_d_ff,
            features=frozenset({"compile"}),
        )
    ]
