"""ffn=swiglu: the gated SiLU feed-forward network (Shazeer, 2020), CS336 §3.4.2."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Component, hookimpl
from lmcore.nn import Linear, silu


class SwiGLU(nn.Module):
    """`w2(silu(w1 x) * w3 x)` with `w1, w3: (d_ff, d_model)` and `w2: (d_model, d_ff)`."""

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        return self.w2(silu(self.w1(x)) * self.w3(x))


def default_d_ff(d_model: int) -> int:
    """8/3 · d_model rounded to a multiple of 64 (at least 64): SwiGLU's three matrices then hold
    about as many parameters as a 4·d_model two-matrix FFN."""
    return max(64, round(8 * d_model / 3 / 64) * 64)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="ffn",
            name="swiglu",
            build=SwiGLU,
            help="gated SiLU FFN: w2(silu(w1 x) * w3 x)",
            params=lambda d_model, d_ff: 3 * d_model * d_ff,
            flops=lambda d_model, d_ff, seq_len: 3 * 2 * seq_len * d_model * d_ff,
            default_d_ff=default_d_ff,
            features=frozenset({"compile"}),
        )
    ]
