"""The weight-format kind's contracts pass on a healthy third-party format and each catches
its planted bug with a message naming the component and what is wrong. The built-ins' run
is test_suite_builtins.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Component
from lmcore.model.roles import SCALAR, Role
from lmcore.testing import ConformanceError, cases
from tests.helpers.errors import raises_naming
from tests.helpers.kit import WithBuiltins

FROM = "from registered in-process (plugin 'planted'"


class Halves(nn.Module):
    """float16 weights: a healthy format (its dequantize formula is the cast back)."""

    def __init__(self, in_features: int, out_features: int, role: str, **_: Any):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.w = nn.Parameter(torch.zeros(out_features, in_features, dtype=torch.float16),
                              requires_grad=False)  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.dequantize().T

    def dequantize(self) -> Tensor:
        return self.w.float()

    def quantize_(self, w: Tensor) -> None:
        self.w = nn.Parameter(w.detach().to(torch.float16), requires_grad=False)

    def rows(self, ids: Tensor) -> Tensor:
        return self.dequantize()[ids]

    def parameter_roles(self) -> dict[str, Role]:
        return {"w": SCALAR}


class Noisy(Halves):
    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x) + 0.5 * x.abs().sum(-1, keepdim=True)  # the kernel is off


class Sloppy(Halves):
    def quantize_(self, w: Tensor) -> None:
        super().quantize_(w.sign())  # keeps only the signs


class Forgetful(Halves):
    """Stores w / 2 and remembers the 2 in a plain attribute, which no state dict holds."""

    factor = 1.0

    def quantize_(self, w: Tensor) -> None:
        super().quantize_(w / 2)
        self.factor = 2.0

    def dequantize(self) -> Tensor:
        return self.w.float() * self.factor


def fmt(name: str, build: Any, per_param: int = 2) -> Component:
    return Component(kind="quant", name=name, build=build, help="planted",
                     params=lambda: 0, flops=lambda: 0,
                     stored=lambda in_features, out_features: per_param * in_features * out_features)  # fmt: skip


def cases_of(component: Component) -> list[Any]:
    return cases(WithBuiltins(component).registry, components=[f"planted:{component.name}"])


def test_a_healthy_third_party_format_passes_every_check() -> None:
    found = cases_of(fmt("halves", Halves))
    assert [c.check.name for c in found] == [
        "quantized_matmul", "quantized_rounding", "stored_bytes", "quantized_state",
    ]  # fmt: skip
    for case in found:
        case.run()


PLANTED = [
    ("quantized_matmul", fmt("noisy", Noisy),
     ("quant 'noisy'", "away from x @ dequantize().T (tolerance 0.03)")),
    ("quantized_rounding", fmt("sloppy", Sloppy),
     ("quant 'sloppy'", "it does not keep what it is given")),
    ("stored_bytes", fmt("miscounted", Halves, per_param=1),
     ("quant 'miscounted'", "declares stored=6144 bytes", "holds 12,288")),
    ("quantized_state", fmt("forgetful", Forgetful),
     ("quant 'forgetful'", "a model loaded from its state dict gives other logits",
      "the module's tensors must be all it needs")),
]  # fmt: skip


@pytest.mark.parametrize(("check", "component", "facts"), PLANTED,
                         ids=[c.name for _, c, _ in PLANTED])  # fmt: skip
def test_each_planted_bug_fails_its_check_naming_it(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    [case] = [c for c in cases_of(component) if c.check.name == check]
    with raises_naming(ConformanceError, *facts, FROM):
        case.run()
