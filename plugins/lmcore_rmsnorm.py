"""norm=rmsnorm: root-mean-square layer normalisation (Zhang & Sennrich, 2019), CS336 §3.4.1."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl


class RMSNorm(nn.Module):
    """`x / sqrt(mean(x²) + eps) * weight`, computed in float32 and returned in the input dtype."""

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        in_dtype = x.dtype
        x = x.to(torch.float32)  # bf16 squares lose too much precision
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(in_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="norm",
            name="rmsnorm",
            build=RMSNorm,
            args=(Arg("eps", float, 1e-5, "added to mean(x²) inside the square root", gt=0.0),),
            help="RMSNorm with a learned gain, computed in float32",
            params=lambda d_model: d_model,
            # float32 x (the input itself, or its float32 copy), x / rms and rms.
            activations=lambda batch, seq_len, d_model: 4 * batch * seq_len * (2 * d_model + 1),
            features=frozenset({"compile"}),
        )
    ]
