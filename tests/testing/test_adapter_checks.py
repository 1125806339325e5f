"""The adapter kind's contracts (init, trainable, merge, state) pass on a healthy third-party
adapter and each catches its planted bug with a message naming the component and what is
wrong. The built-ins' run is test_suite_builtins.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Component
from lmcore.model.roles import MATRIX, Role
from lmcore.testing import ConformanceError, cases
from tests.helpers.errors import raises_naming
from tests.helpers.kit import WithBuiltins

FROM = "from registered in-process (plugin 'planted'"


class Dense(nn.Module):
    """A full-rank update D (out × in), zeros at first: healthy."""

    def __init__(self, in_features: int, out_features: int, splits: Sequence[int], **_: Any):
        super().__init__()
        self.d = nn.Parameter(torch.zeros(out_features, in_features))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.d.T

    def delta(self) -> Tensor:
        return self.d

    def parameter_roles(self) -> dict[str, Role]:
        return {"d": MATRIX}


class StartsNonzero(Dense):
    def __init__(self, in_features: int, out_features: int, splits: Sequence[int]):
        super().__init__(in_features, out_features, splits)
        with torch.no_grad():
            self.d.fill_(0.01)


class DeltaTransposed(Dense):
    def delta(self) -> Tensor:
        return self.d * 2.0  # not what forward applies


class Unused(Dense):
    def __init__(self, in_features: int, out_features: int, splits: Sequence[int]):
        super().__init__(in_features, out_features, splits)
        self.unused = nn.Parameter(torch.zeros(3))

    def parameter_roles(self) -> dict[str, Role]:
        return {"d": MATRIX, "unused": Role("scalar")}


class PlainAttribute(Dense):
    def __init__(self, in_features: int, out_features: int, splits: Sequence[int]):
        super().__init__(in_features, out_features, splits)
        self.gain = 1.0 + float(torch.rand(()))  # drawn, but kept outside the state dict

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.d.T * self.gain

    def delta(self) -> Tensor:
        return self.d * self.gain


def adapter(name: str, build: Any) -> Component:
    return Component(kind="adapter", name=name, build=build, help="planted",
                     params=lambda in_features, out_features: in_features * out_features,
                     flops=lambda: 0)  # fmt: skip


def cases_of(component: Component) -> list[Any]:
    return cases(WithBuiltins(component).registry, components=[f"planted:{component.name}"])


def test_a_healthy_third_party_adapter_passes_every_check() -> None:
    found = cases_of(adapter("dense", Dense))
    assert [c.check.name for c in found] == ["init", "trainable", "merge", "state"]
    for case in found:
        case.run()


PLANTED = [
    ("init", adapter("starts-nonzero", StartsNonzero),
     ("adapter 'starts-nonzero'", "at initialisation it changes the model's logits")),
    ("merge", adapter("delta-twice", DeltaTransposed),
     ("adapter 'delta-twice'", "the merged model's logits differ", "x @ delta().T")),
    ("trainable", adapter("unused", Unused),
     ("adapter 'unused'", "without a gradient", ".unused")),
    ("state", adapter("plain-attribute", PlainAttribute),
     ("adapter 'plain-attribute'", "part of its state is not in state_dict()")),
]  # fmt: skip


@pytest.mark.parametrize(("check", "component", "facts"), PLANTED,
                         ids=[c.name for _, c, _ in PLANTED])  # fmt: skip
def test_each_planted_bug_fails_its_check_naming_it(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    [case] = [c for c in cases_of(component) if c.check.name == check]
    with raises_naming(ConformanceError, *facts, FROM):
        case.run()
