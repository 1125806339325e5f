"""The checks beyond one eager forward (compile; the KV cache and packed documents in a model
around the component) catch their planted bugs, and the cache check skips where no model can be
built."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from lmcore import Component
from lmcore.interfaces import PositionalEncodingBase
from lmcore.model.nn import Linear
from tests.helpers.errors import raises_naming
from tests.helpers.kit import (
    PLANTED,
    PlantedRegistry,
    StartAlignedAttention,
    WithBuiltins,
    assert_planted_bug_beside_the_builtins_fails,
    assert_planted_bug_fails_its_check,
    attn,
    beside_builtins_caught_by,
    planted_bugs_caught_by,
)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


@pytest.mark.parametrize("component", planted_bugs_caught_by("runtime_checks"))
def test_each_planted_bug_fails_its_check_and_names_it(
    pytester: pytest.Pytester, component: str
) -> None:
    assert_planted_bug_fails_its_check(pytester, component)


@pytest.mark.parametrize(
    ("check", "component", "facts"), beside_builtins_caught_by("runtime_checks")
)
def test_each_planted_bug_beside_the_builtins_fails_its_check(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    assert_planted_bug_beside_the_builtins_fails(check, component, facts)


class StartPositions(PositionalEncodingBase):
    """Planted: embeds at 0..T-1 whatever positions it is given (right for a full forward, wrong
    for the tokens after a KV cache)."""

    def __init__(self, d_model: int, context_length: int, device: Any = None):
        super().__init__()
        self.table = torch.randn(context_length, d_model, device=device)

    def embed(self, x: Tensor, token_positions: Tensor) -> Tensor:
        return x + self.table[: x.shape[1]].to(x.dtype)


@pytest.mark.parametrize(
    ("component", "facts"),
    [
        (
            Component(kind="pos", name="start-positions", build=StartPositions,
                      features=frozenset({"absolute"})),
            ("with a KV cache, 2 new token(s) after 5 cached ones (attn gets Sq=2, Sk=7)",
             "do not give the logits of a full forward", "the pos hooks use the positions they are given"),
        ),
        (
            attn("start-aligned", StartAlignedAttention),  # its other checks fail too
            ("2 new token(s) after 5 cached ones (attn gets Sq=2, Sk=7)",
             "The kernel must align causal queries to the end of the keys"),
        ),
    ],
    ids=["pos", "attn"],
)  # fmt: skip
def test_a_component_that_breaks_the_cache_fails_and_names_it(
    component: Component, facts: tuple[str, ...]
) -> None:
    from lmcore.testing import ConformanceError, cases

    registry = WithBuiltins(component).registry
    [case] = [c for c in cases(registry, components=[component.name]) if c.check.name == "cache"]
    assert case.skip_reason is None
    with raises_naming(ConformanceError, *facts):
        case.run()
    # Declared, the check has nothing to hold it to (generation refuses it instead).
    declared = dataclasses.replace(component, features=component.features | {"nocache"})
    registry = WithBuiltins(declared).registry
    [case] = [c for c in cases(registry, components=[component.name]) if c.check.name == "cache"]
    case.run()


def test_the_cache_check_skips_where_no_model_can_be_built_around_the_component() -> None:
    from lmcore.testing import cases

    [case] = [c for c in cases(PlantedRegistry(PLANTED[0]).registry) if c.check.name == "cache"]
    assert case.skip_reason == (
        "the check builds a model around norm:good-norm, but the registry lacks the default block "
        "'prenorm', ffn 'swiglu', pos 'rope', attn 'sdpa', mixer 'attention' for the other slots "
        "(lmcore's built-ins are not loaded)"
    )


class LeakyStateMixer(nn.Module):
    """Planted: a running mean over the row, never reset, though it declares 'documents'."""

    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__()
        self.proj = Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor, context: Any) -> Tensor:
        steps = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]
        return self.proj(x.cumsum(dim=1) / steps)


@pytest.mark.parametrize(
    ("component", "facts"),
    [
        (
            Component(kind="pos", name="start-positions", build=StartPositions,
                      features=frozenset({"absolute"})),
            ("pos=start-positions", "document 1 of a packed row (0..4, 5..13, 14..17) does not give "
             "the logits it gives alone", "Its positions restart at 0 at its first token"),
        ),
        (
            Component(kind="mixer", name="leaky-state", build=LeakyStateMixer,
                      features=frozenset({"documents", "nocache"}), activations=lambda: 0),
            ("mixer=leaky-state", "changing the tokens of document 1 changed the logits of document 2",
             "resets its state and convolution at each document's first token"),
        ),
    ],
    ids=["pos", "mixer"],
)  # fmt: skip
def test_a_component_that_lets_documents_meet_fails_and_names_it(
    component: Component, facts: tuple[str, ...]
) -> None:
    from lmcore.testing import ConformanceError, cases

    registry = WithBuiltins(component).registry
    found = cases(registry, components=[component.name])
    [case] = [c for c in found if c.check.name == "documents"]
    assert case.skip_reason is None
    with raises_naming(ConformanceError, *facts):
        case.run()


def test_a_kernel_without_documents_is_not_held_to_them() -> None:
    """Undeclared, the check has nothing to hold it to: a forward with documents refuses it."""
    from lmcore.testing import cases
    from tests.helpers.kit import KIT_OPTIONS, DocumentBlindAttention

    component = attn("document-blind", DocumentBlindAttention, features=KIT_OPTIONS)
    [case] = [c for c in cases(WithBuiltins(component).registry, components=[component.name])
              if c.check.name == "documents"]  # fmt: skip
    case.run()
