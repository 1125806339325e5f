"""The kit's mixer checks each fail on a mixer planted with the bug they are for, naming it:
one that looks ahead (`mixes_causally`), one whose cached step forgets its state (`recurrent`),
one that declares the wrong state bytes (`state`); short_conv itself passes all three."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import lmcore_short_conv as sc
from lmcore import Component, Registry
from lmcore.interfaces import LayerContext
from lmcore.testing import cases
from lmcore.testing.core import ConformanceError


class LooksAhead(sc.ShortConv):
    """The convolution run over the sequence reversed: every output sees the later tokens."""

    def forward(self, x: Tensor, context: LayerContext) -> Tensor:
        return super().forward(x.flip(1), LayerContext()).flip(1)


class Forgets(sc.ShortConv):
    """A cached step that starts from zeros instead of the state it is given."""

    def forward(self, x: Tensor, context: LayerContext) -> Tensor:
        if context.cache is not None:
            context = context._replace(cache=type(context.cache)(context.cache.state, 0))
        return super().forward(x, context)


def planted(name: str, build: Any, state: Any = sc.state) -> Registry:
    registry = Registry()
    registry.add(
        Component(kind="mixer", name=name, build=build, args=sc.lmcore_components()[0].args,
                  params=sc.params, flops=sc.flops, state=state,
                  features=frozenset({"mask"})),
        name="planted",
    )  # fmt: skip
    return registry


def run(registry: Registry, name: str, check: str) -> None:
    [case] = [c for c in cases(registry, components=[name]) if c.check.name == check
              and not c.target.overrides]  # fmt: skip
    with torch.random.fork_rng():
        case.run()


@pytest.mark.parametrize(
    ("name", "build", "state", "check", "message"),
    [
        ("ahead", LooksAhead, sc.state, "mixes_causally",
         r"changing the inputs from position 8 on changed the outputs before it"),
        ("forgets", Forgets, sc.state, "recurrent",
         r"decoding one token at a time from a fresh state does not give the outputs"),
        ("misstated", sc.ShortConv, lambda: (0, 0), "state",
         r"declares state\(\) = \(0, 0\), i.e. 0 bytes .* but decoding_state allocates 512"),
    ],
)  # fmt: skip
def test_a_planted_bug_fails_its_check(
    name: str, build: Any, state: Any, check: str, message: str
) -> None:
    with pytest.raises(ConformanceError, match=message):
        run(planted(name, build, state), name, check)


@pytest.mark.parametrize("check", ["mixes_causally", "recurrent", "state"])
def test_short_conv_passes_them(check: str) -> None:
    run(planted("same", sc.ShortConv), "same", check)
