"""norm=rmsnorm: root-mean-square layer normalisation (Zhang & Sennrich, 2019), CS336 §3.4.1.

`zero_centered=true` is Gemma's variant: the gain is `1 + weight` with `weight` starting at zero
(computed in float32, as Gemma's `x · (1 + w)` is), so weight decay pulls the gain towards 1.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.model.roles import GAIN, Role


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`(x / rms · weight, rms)`, rms = sqrt(mean(x²) + eps) per row, in float32 or wider."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # bf16 squares lose too much
    rms = xf.square().mean(dim=-1, keepdim=True).add_(eps).sqrt_()  # (..., 1)
    # Divided, not multiplied by rsqrt: a correctly rounded quotient keeps the float32 output
    # within an ulp or so of the exact formula.
    return (xf / rms).mul_(weight).to(x.dtype), rms


class _RMSNorm(torch.autograd.Function):
    """`x · rstd · weight` with `rstd = 1 / sqrt(mean(x²) + eps)`, in float32.

    Autograd through the formula keeps x, x / rms and rms and runs a dozen passes backward; this
    keeps x (in its own dtype) and rms, and differentiates by hand:
    `dx = rstd · (g·w − x̂ · mean(g·w · x̂))`, `dw = Σ g · x̂`, with `x̂ = x · rstd`.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        y, rms = _rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rms)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, rms = ctx.saved_tensors
        rstd = rms.reciprocal()
        x_hat = x.to(rms.dtype) * rstd
        g = grad.to(rms.dtype)
        dweight = None
        if ctx.needs_input_grad[1]:
            dweight = (g * x_hat).reshape(-1, x.shape[-1]).sum(dim=0).to(weight.dtype)
        g_w = g * weight
        dot = (g_w * x_hat).mean(dim=-1, keepdim=True)  # (..., 1)
        dx = g_w.addcmul_(x_hat, dot, value=-1).mul_(rstd).to(x.dtype)
        return dx, dweight, None


class RMSNorm(nn.Module):
    """`x / sqrt(mean(x²) + eps) * weight`, computed in float32 and returned in the input dtype.

    With `zero_centered=True` the gain is `1 + weight` (in float32) and `weight` starts at zeros.
    """

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        zero_centered: bool = False,
    ):
        super().__init__()
        self.eps, self.zero_centered = eps, zero_centered
        init = torch.zeros if zero_centered else torch.ones
        self.weight = nn.Parameter(init(d_model, device=device, dtype=dtype))

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        gain = self.weight
        if self.zero_centered:  # in float32: a bf16 1 + w would round the gain to 8 bits
            gain = self.weight.to(torch.promote_types(self.weight.dtype, torch.float32)) + 1.0
        if not torch.is_grad_enabled():  # inference: the same numbers without autograd's node
            return _rms_norm(x, gain, self.eps)[0]
        y: Tensor = _RMSNorm.apply(x, gain, self.eps)
        return y

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}

    def extra_repr(self) -> str:
        centred = ", zero_centered=True" if self.zero_centered else ""
        return f"{self.weight.shape[0]}, eps={self.eps}{centred}"


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="norm",
            name="rmsnorm",
            build=RMSNorm,
            args=(
                Arg("eps", float, 1e-5, "added to mean(x²) inside the square root", gt=0.0),
                Arg(
                    "zero_centered",
                    bool,
                    False,
                    "the gain is 1 + weight, weight starting at 0 (Gemma)",
                    written="changed",
                ),
            ),
            help="RMSNorm with a learned gain, computed in float32",
            params=lambda d_model: d_model,
            # x in its own dtype and the float32 rms per token; zero-centred, also the float32
            # gain 1 + weight.
            activations=lambda batch, seq_len, d_model, dtype, zero_centered: (
                batch * seq_len * (d_model * dtype.itemsize + 4) + 4 * d_model * zero_centered
            ),
            features=frozenset({"compile"}),
        )
    ]
