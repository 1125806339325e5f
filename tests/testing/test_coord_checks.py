"""The coordinate check passes on a healthy third-party ffn and fails, naming it, on one whose
hidden matrix is declared a scalar (so muP's learning-rate rule skips it) and on one that
declares no roles. The built-ins' run is test_suite_builtins.py."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from lmcore import Component
from lmcore.model.roles import MATRIX, SCALAR, Role
from lmcore.testing import ConformanceError, cases
from tests.helpers.errors import raises_naming
from tests.helpers.kit import WithBuiltins


class TwoLayer(nn.Module):
    """`w2 silu(w1 x)`, both matrices drawn as lmcore's Linear draws its weight."""

    def __init__(self, d_model: int, d_ff: int, device: Any = None, dtype: Any = None):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(d_ff, d_model, device=device, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(d_model, d_ff, device=device, dtype=dtype))
        for w in (self.w1, self.w2):
            std = math.sqrt(2.0 / sum(w.shape))
            nn.init.trunc_normal_(w, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: Tensor) -> Tensor:
        h = x @ self.w1.T
        return (h * torch.sigmoid(h)) @ self.w2.T

    def parameter_roles(self) -> dict[str, Role]:
        return {"w1": MATRIX, "w2": MATRIX}


class ScalarDeclared(TwoLayer):
    """Planted: w2 is a hidden matrix declared a scalar, so muP leaves its learning rate."""

    def parameter_roles(self) -> dict[str, Role]:
        return {"w1": MATRIX, "w2": SCALAR}


class Roleless(TwoLayer):
    """Planted: declares no roles at all."""

    parameter_roles = None  # type: ignore[assignment]


def ffn(name: str, build: Any) -> Component:
    return Component(kind="ffn", name=name, build=build, help="planted",
                     params=lambda d_model, d_ff: 2 * d_model * d_ff,
                     flops=lambda d_model, d_ff, seq_len: 4 * seq_len * d_model * d_ff)  # fmt: skip


def coordinates_case(component: Component) -> Any:
    found = cases(WithBuiltins(component).registry, components=[f"planted:{component.name}"])
    [case] = [c for c in found if c.check.name == "coordinates"]
    return case


def test_a_healthy_ffn_passes_the_coordinate_check() -> None:
    coordinates_case(ffn("two-layer", TwoLayer)).run()


def test_a_hidden_matrix_declared_a_scalar_fails_naming_the_ffn_and_the_layer() -> None:
    with raises_naming(
        ConformanceError, "ffn 'scalar-declared'", "parametrization=mup(base_width=64",
        "move the 0.ffn scales with the width", "outside ±0.25", "parameter_roles()",
    ):  # fmt: skip
        coordinates_case(ffn("scalar-declared", ScalarDeclared)).run()


def test_an_ffn_without_roles_fails_naming_it_and_its_class() -> None:
    with raises_naming(
        ConformanceError, "ffn 'roleless'", "declares no roles", "Roleless should declare it"
    ):
        coordinates_case(ffn("roleless", Roleless)).run()
