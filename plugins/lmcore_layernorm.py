"""norm=layernorm: layer normalisation (Ba et al., 2016) with an optional bias."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.model.roles import BIAS, GAIN, Role


class LayerNorm(nn.Module):
    """`(x - mean(x)) / sqrt(var(x) + eps) * weight + bias` over the last dimension.

    The variance is the biased (population) one, as in torch's LayerNorm. Computed in float32
    and returned in the input dtype, like RMSNorm. `weight` starts at ones, `bias` at zeros.
    """

    def __init__(
        self,
        d_model: int,
        bias: bool = True,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(d_model, device=device, dtype=dtype)) if bias else None

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        in_dtype = x.dtype
        x = x.to(torch.float32)  # bf16 means and squares lose too much precision
        centred = x - x.mean(dim=-1, keepdim=True)
        var = centred.pow(2).mean(dim=-1, keepdim=True)
        y = centred / torch.sqrt(var + self.eps) * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(in_dtype)

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN, "bias": BIAS}

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, bias={self.bias is not None}, eps={self.eps}"


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="norm",
            name="layernorm",
            build=LayerNorm,
            args=(
                Arg("bias", bool, True, "learn an additive bias after the gain"),
                Arg("eps", float, 1e-5, "added to the variance inside the square root", gt=0.0),
            ),
            help="LayerNorm (mean and variance) with a gain and optional bias, in float32",
            params=lambda d_model, bias: 2 * d_model if bias else d_model,
            # float32 x - mean, (x - mean) / std and std; the mean itself is not kept.
            activations=lambda batch, seq_len, d_model: 4 * batch * seq_len * (2 * d_model + 1),
            features=frozenset({"compile"}),
        )
    ]
