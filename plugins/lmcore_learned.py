"""pos=learned: absolute positions from a learned `(context_length, d_model)` table (GPT-2 style),
added to the token embeddings.

Init: truncated normal σ=1 on [-3, 3], the same as the CS336 token `Embedding`, so position and
token vectors start at the same scale (GPT-2's σ=0.01/0.02 assumes token embeddings of σ=0.02).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lmcore import Component, hookimpl
from lmcore.interfaces import PositionalEncodingBase
from lmcore.model.roles import EMBEDDING, Role

# 2**31 elements is 8 GiB in float32 per copy (and more for optimiser state): surely a typo.
MAX_TABLE_ELEMENTS = 2**31


class LearnedPositionalEmbedding(PositionalEncodingBase):
    """`x + weight[token_positions]` with `weight: (context_length, d_model)`.

    Held by the model at `model.pos`, so its state-dict key is `pos.weight`.
    """

    def __init__(
        self,
        context_length: int,
        d_model: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(context_length, d_model, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def embed(
        self, x: Float[Tensor, "B T d_model"], token_positions: Int[Tensor, "B T"]
    ) -> Float[Tensor, "B T d_model"]:
        return x + self.weight[token_positions].to(x.dtype)  # (B or 1, T, d_model) broadcasts

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": EMBEDDING}  # a row per position, looked up as a token's is

    def extra_repr(self) -> str:
        return f"context_length={self.weight.shape[0]}, d_model={self.weight.shape[1]}"


def _check(context_length: int, d_model: int) -> None:
    size = context_length * d_model
    if size > MAX_TABLE_ELEMENTS:
        raise ValueError(
            f"a learned table of context_length={context_length} × d_model={d_model} = {size:,} "
            f"elements exceeds {MAX_TABLE_ELEMENTS:,} (2**31); lower context_length to at most "
            f"{MAX_TABLE_ELEMENTS // d_model}, or use a table-free encoding such as pos=rope or "
            "pos=alibi"
        )


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="pos",
            name="learned",
            build=LearnedPositionalEmbedding,
            help="learned absolute positions added to the token embeddings (key pos.weight)",
            params=lambda context_length, d_model: context_length * d_model,
            # The (1, T) int64 positions the table lookup needs for its gradient.
            activations=lambda seq_len: 8 * seq_len,
            features=frozenset({"absolute", "compile"}),
            validate=_check,
        )
    ]
