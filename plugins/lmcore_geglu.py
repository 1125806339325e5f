"""ffn=geglu: the gated GELU feed-forward network `w2(gelu(w1 x) * w3 x)` (Shazeer, 2020).

SwiGLU with the exact erf GELU in place of SiLU; same keys, shapes and default width.
"""

from __future__ import annotations

import torch

from lmcore import Component, hookimpl
from lmcore.nn import FeedForward, feed_forward_activations, gated_d_ff, gelu


def GEGLU(
    d_model: int,
    d_ff: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> FeedForward:
    """`w2(gelu(w1 x) * w3 x)` with `w1, w3: (d_ff, d_model)` and `w2: (d_model, d_ff)`."""
    return FeedForward(d_model, d_ff, gelu, gated=True, device=device, dtype=dtype)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="ffn",
            name="geglu",
            build=GEGLU,
            help="gated GELU FFN: w2(gelu(w1 x) * w3 x)",
            params=lambda d_model, d_ff: 3 * d_model * d_ff,
            flops=lambda d_model, d_ff, seq_len: 3 * 2 * seq_len * d_model * d_ff,
            activations=feed_forward_activations(activation_saves=3, gated=True),
            default_d_ff=gated_d_ff,
            features=frozenset({"compile"}),
        )
    ]
