"""block=ngpt: the normalised residual of nGPT (Loshchilov et al., 2024, "nGPT: Normalized
Transformer with Representation Learning on the Hypersphere").

The residual stream stays on the unit sphere: each sub-layer's output is normalised, and the
stream moves a learned fraction of the way towards it, then is normalised again,

    h = unit(h + alpha_attn * (unit(attn(h)) - h))
    h = unit(h + alpha_ffn  * (unit(ffn(h))  - h))

with `unit(x) = x / |x|` (over the last dimension, in float32) and `alpha_attn`, `alpha_ffn`
learnable per-channel "eigen learning rates" initialised to `alpha_init`. The block uses no norm
of the model's kind (its `norms` declaration is empty). This is nGPT's block only: the paper also
normalises the embeddings and the weight matrices, which a block cannot do.

This module is a complete lmcore plugin: the `lmcore_components` hook below returns the
declaration, and pyproject.toml names this module under the entry-point group `lmcore`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import LayerContext
from lmcore.model.roles import SCALAR, Role

EPS = 1e-6  # the smallest norm divided by


def unit(x: Float[Tensor, "... d"]) -> Float[Tensor, "... d"]:
    """`x / |x|` over the last dimension, computed in float32, returned in x's dtype."""
    xf = x.float()
    return (xf / torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(EPS)).to(x.dtype)


class NormalizedBlock(nn.Module):
    """`h = unit(h + α_a (unit(attn(h)) - h)); h = unit(h + α_f (unit(ffn(h)) - h))`."""

    def __init__(
        self,
        *,
        d_model: int,
        attn: nn.Module,
        ffn: nn.Module,
        alpha_init: float = 0.05,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.attn, self.ffn = attn, ffn
        self.alpha_attn = nn.Parameter(
            torch.full((d_model,), alpha_init, device=device, dtype=dtype)
        )
        self.alpha_ffn = nn.Parameter(
            torch.full((d_model,), alpha_init, device=device, dtype=dtype)
        )

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        a = unit(self.attn(x, context))
        h = unit(x + self.alpha_attn * (a - x))
        f = unit(self.ffn(h))
        return unit(h + self.alpha_ffn * (f - h))

    def parameter_roles(self) -> dict[str, Role]:
        return {"alpha_attn": SCALAR, "alpha_ffn": SCALAR}  # nGPT's eigen learning rates


def ngpt_activations(batch: int, seq_len: int, d_model: int, dtype: torch.dtype) -> int:
    """Bytes kept for backward: each of the four `unit`s keeps its float32 input and the norm
    and clamped norm of each row; each of the two `alpha * (...)` keeps the difference."""
    rows = batch * seq_len
    return 4 * rows * (4 * d_model + 4 + 4) + 2 * rows * d_model * dtype.itemsize


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="block",
            name="ngpt",
            build=NormalizedBlock,
            args=(
                Arg(
                    "alpha_init",
                    float,
                    0.05,
                    "initial step towards each sub-layer's output",
                    gt=0.0,
                ),
            ),
            help="nGPT's normalised residual: the stream stays on the unit sphere",
            params=lambda d_model: 2 * d_model,  # alpha_attn and alpha_ffn
            activations=ngpt_activations,
            norms=lambda: (),  # builds none of the model's norms
            buffers=lambda: 0,
            # nomup: the stream lives on the unit sphere, each coordinate ~1/sqrt(d_model)
            features=frozenset({"compile", "nomup"}),
        )
    ]
