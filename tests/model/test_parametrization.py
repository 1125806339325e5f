"""lmcore.model.parametrization: a component that declares no roles is refused by name, a
factory that returns no rules or an impossible std is a plugin error naming it, and the
optimizer check passes any optimizer without a parametrization."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Arg, Component, TransformerLM, scoped_registry
from lmcore.errors import PluginError
from lmcore.model.parametrization import check_optimizer, lr_multipliers
from lmcore.model.roles import Role
from lmcore.train.recipe import resolve_recipe
from tests.helpers.errors import raises_naming

SPEC = "vocab_size=64, context_length=8, d_model=32, num_layers=1, num_heads=2, d_ff=32"


class Roleless(nn.Module):
    """An ffn whose one matrix has no declared role."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d_model, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.w.T


class Rules:
    """Rules that draw every matrix with the std `std`."""

    output_multiplier = 1.0
    query_factor = 1.0

    def __init__(self, std: float = 0.02, **_: Any):
        self.std = std

    def init_std(self, role: Role, shape: tuple[int, ...]) -> float | None:
        return self.std if role.name == "matrix" else None

    def lr_scale(self, role: Role) -> float:
        return 0.5 if role.name == "matrix" else 1.0


def parametrization(name: str, build: Any, *args: Arg) -> Component:
    return Component(kind="parametrization", name=name, build=build, args=args,
                     params=lambda: 0, flops=lambda: 0)  # fmt: skip


def test_a_component_without_roles_is_refused_naming_it() -> None:
    ffn = Component(kind="ffn", name="roleless", build=Roleless, params=lambda d_model: d_model**2,
                    flops=lambda: 0)  # fmt: skip
    with scoped_registry() as registry:
        registry.add(ffn, name="planted")
        with raises_naming(PluginError, "parametrization=mup(base_width=16,zero_head=false)",
                           "ffn 'roleless'", "declares no roles", "'layers.0.ffn.w'",
                           "Roleless should declare it"):  # fmt: skip
            TransformerLM(f"{SPEC}, ffn=roleless, parametrization=mup(base_width=16)")


def test_a_third_party_parametrization_sets_init_and_learning_rates() -> None:
    with scoped_registry() as registry:
        registry.add(parametrization("fixed", Rules, Arg("std", float, 0.02)), name="planted")
        torch.manual_seed(0)
        model = TransformerLM(f"{SPEC}, parametrization=fixed(std=0.5)")
    w = model.layers[0].ffn.w1.weight
    assert w.std().item() == pytest.approx(0.5 * 0.9866, rel=0.15)
    assert lr_multipliers(model) == {"matrix": 0.5, "embedding": 1.0, "gain": 1.0, "head": 1.0}


@pytest.mark.parametrize(
    ("build", "facts"),
    [
        (lambda: object(), ("parametrization 'bad'", "its factory returned object")),
        (lambda: Rules(std=float("nan")), ("parametrization 'bad'", "init_std of", "nan")),
    ],
)
def test_a_broken_parametrization_is_named(build: Any, facts: tuple[str, ...]) -> None:
    with scoped_registry() as registry:
        registry.add(parametrization("bad", build), name="planted")
        with raises_naming(PluginError, *facts):
            TransformerLM(f"{SPEC}, parametrization=bad")


def test_without_a_parametrization_any_optimizer_is_fine() -> None:
    check_optimizer(None, resolve_recipe("optimizer", "sgd"))
    assert lr_multipliers(TransformerLM(SPEC)) == {}


def test_a_block_that_declares_nomup_is_refused_naming_it() -> None:
    import dataclasses

    from lmcore.registry import get_registry

    prenorm = get_registry().get("block", "prenorm").component
    sphere = dataclasses.replace(prenorm, name="sphere", features=prenorm.features | {"nomup"})
    with scoped_registry() as registry:
        registry.add(sphere, name="planted")
        TransformerLM(f"{SPEC}, block=sphere")  # without muP it builds
        with raises_naming(PluginError, "parametrization=mup(base_width=16,zero_head=false)",
                           "block 'sphere'", "declares 'nomup'",
                           "leave out parametrization= or use another block"):  # fmt: skip
            TransformerLM(f"{SPEC}, block=sphere, parametrization=mup(base_width=16)")
