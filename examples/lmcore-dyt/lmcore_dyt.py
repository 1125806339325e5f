"""norm=dyt: Dynamic Tanh (Zhu et al., 2025, "Transformers without Normalization").

A drop-in replacement for a normalisation layer that computes no statistics:

    DyT(x) = weight * tanh(alpha * x) + bias

with `alpha` one learnable scalar (initialised to `alpha_init`), and `weight` / `bias` learnable
per-channel vectors initialised to ones / zeros, like a LayerNorm's affine part.

This module is a complete lmcore plugin: the `lmcore_components` hook below returns the
declaration, and pyproject.toml names this module under the entry-point group `lmcore`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.model.roles import BIAS, GAIN, SCALAR, Role


class DyT(nn.Module):
    """`weight * tanh(alpha * x) + bias` over the last dimension.

    Computed in float32 and returned in the input dtype, so a bfloat16 model keeps bfloat16
    activations while tanh's saturation is evaluated accurately.
    """

    def __init__(
        self,
        d_model: int,
        alpha_init: float = 0.5,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), alpha_init, device=device, dtype=dtype))
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(d_model, device=device, dtype=dtype)) if bias else None

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        y = torch.tanh(self.alpha.float() * x.float()) * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def parameter_roles(self) -> dict[str, Role]:
        # alpha: one learned number (no weight decay by default), like a gain's
        return {"alpha": SCALAR, "weight": GAIN, "bias": BIAS}

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}"


def dyt_params(d_model: int, bias: bool) -> int:
    """alpha (1) + weight (d_model) + bias (d_model, when enabled)."""
    return 1 + d_model + (d_model if bias else 0)


def dyt_activations(batch: int, seq_len: int, d_model: int, dtype: torch.dtype) -> int:
    """Bytes kept for backward: float32 x (for alpha's gradient) and tanh(alpha x) (for tanh's
    and weight's). In a model that is not float32, also the float32 copies of alpha and weight
    that the products keep."""
    copies = 0 if dtype == torch.float32 else 4 * (1 + d_model)
    return 2 * 4 * batch * seq_len * d_model + copies


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="norm",
            name="dyt",
            build=DyT,
            args=(
                Arg("alpha_init", float, 0.5, "initial value of the learnable scale alpha", gt=0.0),
                Arg("bias", bool, True, "learn an additive bias after the gain"),
            ),
            help="Dynamic Tanh: weight * tanh(alpha * x) + bias, no statistics (Zhu 2025)",
            params=dyt_params,
            activations=dyt_activations,
            # Element-wise only: no matmul FLOPs.
            features=frozenset({"compile"}),
        )
    ]
