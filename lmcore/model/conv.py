"""The short causal depthwise convolution the recurrent mixers share (gated DeltaNet's q/k/v
convolution, Mamba-2's, LFM2's gated short convolution), with the tail that continues it.

`y[t, c] = b[c] + Σ_j w[c, j] · x[t - K + 1 + j, c]` over the sequence, the `K - 1` inputs
before the first taken from `tail` (zeros at the start of a sequence), as torch's
`conv1d(groups=C, padding=K-1)` cut to the first T outputs computes it. The tail after the call
is the last `K - 1` inputs: a decoding step passes it back and gets what the whole sequence
would give. Written as K shifted multiply-adds: K is 2 to 4 in every model that uses it, where
this beats an unfolded einsum on a CPU and keeps one padded copy of x for backward (the slices
are views of it). Not a matmul, so it adds no FLOPs by the 2·m·n·p rule lmcore counts.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lmcore.model.roles import BIAS, CONV, Role


def causal_conv(
    x: Float[Tensor, "B T C"],
    weight: Float[Tensor, "C K"],
    bias: Float[Tensor, " C"] | None = None,
    tail: Float[Tensor, "B C K1"] | None = None,
    documents: Int[Tensor, "B T"] | None = None,
) -> tuple[Float[Tensor, "B T C"], Float[Tensor, "B C K1"]]:
    """`(y, tail)`: the causal depthwise convolution of `x` along T (module docstring), and its
    last `K - 1` inputs `(B, C, K - 1)` to continue it. `tail` None: zeros before the first.
    With `documents` (packed rows) a tap that reaches into an earlier document reads a zero,
    as at the start of a sequence."""
    B, T, C = x.shape
    K = weight.shape[1]
    if tail is None:
        before = x.new_zeros(B, K - 1, C)
    else:
        before = tail.transpose(1, 2).to(x.dtype)  # (B, K-1, C)
    padded = torch.cat([before, x], dim=1)  # (B, K-1+T, C)
    y = padded[:, K - 1 :] * weight[:, K - 1]
    seen = None if documents is None else _within(documents, K)
    for j in range(K - 1):
        tap = padded[:, j : j + T] * weight[:, j]
        y = y + (tap if seen is None else tap * seen[K - 1 - j].to(tap.dtype))
    if bias is not None:
        y = y + bias
    return y, padded[:, T:].transpose(1, 2)  # the last K-1 inputs, (B, C, K-1)


def _within(documents: Int[Tensor, "B T"], K: int) -> list[Tensor]:
    """`seen[s] (B, T, 1)`: whether the input s tokens back lies in the token's document."""
    from lmcore.model.documents import document_starts

    back = torch.arange(documents.shape[1], device=documents.device) - document_starts(documents)
    return [(back >= s)[..., None] for s in range(K)]


class DepthwiseConv(nn.Module):
    """The convolution's filters, one per channel, `weight (channels, 1, conv_size)` and, with
    `bias`, `bias (channels,)`, as torch's `Conv1d(groups=channels)` keeps them (and Mamba-2's
    and Qwen3-Next's checkpoints); run by `causal_conv`."""

    def __init__(
        self,
        channels: int,
        conv_size: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        bound = conv_size**-0.5  # torch's default for a depthwise filter
        self.weight = nn.Parameter(
            torch.empty(channels, 1, conv_size, device=device, dtype=dtype).uniform_(-bound, bound)
        )
        self.bias = (
            nn.Parameter(torch.empty(channels, device=device, dtype=dtype).uniform_(-bound, bound))
            if bias
            else None
        )

    def forward(
        self,
        x: Float[Tensor, "B T C"],
        tail: Float[Tensor, "B C K1"] | None,
        documents: Int[Tensor, "B T"] | None = None,
    ) -> tuple[Float[Tensor, "B T C"], Float[Tensor, "B C K1"]]:
        return causal_conv(x, self.weight[:, 0], self.bias, tail, documents)

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": CONV, "bias": BIAS}
