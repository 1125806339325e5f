"""norm=none: no normalisation, the CS336 §7 "remove RMSNorm" ablation."""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Component, hookimpl


class NoNorm(nn.Module):
    """Returns its input unchanged; holds no parameters, so no state-dict keys."""

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        return x


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="norm",
            name="none",
            build=NoNorm,
            help="identity: no normalisation (ablation)",
            activations=lambda: 0,
            features=frozenset({"compile"}),
        )
    ]
