"""pos=alibi: attention with linear biases (Press et al., 2022).

No position is added to the embeddings; each head h adds `-slope_h · (q_pos - k_pos)` to its
attention scores, so a key d tokens back costs `slope_h · d`. Slopes are a geometric sequence:
for n heads a power of two, `slope_h = 2^(-8(h+1)/n)`; otherwise the paper's rule takes the n'
(largest power of two below n) slopes for n', then every other slope for 2n' until n are filled.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lmcore import Component, hookimpl
from lmcore.interfaces import PositionalEncodingBase


def alibi_slopes(num_heads: int) -> list[float]:
    """The per-head slopes of the paper's reference code, head 0 steepest."""

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    below = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(below) + alibi_slopes(2 * below)[0::2][: num_heads - below]


class ALiBi(PositionalEncodingBase):
    """`attention_bias` returns `-slope_h · (q_pos - k_pos)`, shape `(B or 1, H, Sq, Sk)`.

    The slopes are a non-persistent buffer in the model dtype (so the bias matches the scores'
    dtype); the bias itself is computed in float32 and cast at the end.
    """

    slopes: Tensor  # (H,)

    def __init__(
        self,
        num_heads: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        slopes = torch.tensor(alibi_slopes(num_heads), device=device, dtype=torch.float32)
        self.register_buffer(
            "slopes", slopes.to(dtype or torch.get_default_dtype()), persistent=False
        )

    def attention_bias(
        self, q_positions: Int[Tensor, "B Sq"], k_positions: Int[Tensor, "B Sk"]
    ) -> Float[Tensor, "B H Sq Sk"]:
        # Built from the positions given, so a KV cache or packed sequences get the right offsets.
        offset = q_positions[:, None, :, None] - k_positions[:, None, None, :]  # (B, 1, Sq, Sk)
        slopes = self.slopes.float()[None, :, None, None]  # (1, H, 1, 1)
        return (-slopes * offset.float()).to(self.slopes.dtype)  # (B, H, Sq, Sk)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="pos",
            name="alibi",
            build=ALiBi,
            help="linear attention biases per head (Press 2022); needs an attn with 'bias'",
            activations=lambda: 0,  # the bias needs no gradient; the kernel adds it
            buffers=lambda num_heads, dtype: num_heads * dtype.itemsize,  # the slopes
            features=frozenset({"bias", "relative", "compile"}),
        )
    ]
