"""The checks of what every component is as a torch module (build, forward, gradients,
state_dict, meta) catch their planted bugs, each with a message that names it. The kit runs
in-process (pytester) with `--lmcore-conformance` and a registry of planted components."""

from __future__ import annotations

import pytest
from torch import nn

from lmcore import Component
from tests.helpers.errors import assert_naming
from tests.helpers.kit import (
    NODE,
    PlantedRegistry,
    assert_planted_bug_fails_its_check,
    planted_bugs_caught_by,
    run_kit,
)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


@pytest.mark.parametrize("component", planted_bugs_caught_by("module_checks"))
def test_each_planted_bug_fails_its_check_and_names_it(
    pytester: pytest.Pytester, component: str
) -> None:
    assert_planted_bug_fails_its_check(pytester, component)


def test_a_module_that_is_not_a_positional_encoding_fails_build(pytester: pytest.Pytester) -> None:
    bad = Component(kind="pos", name="plain", build=lambda: nn.Identity())
    outcomes = run_kit(pytester, plugin=PlantedRegistry(bad))
    assert_naming(
        outcomes[NODE + "test_build[pos:plain]"],
        "Identity does not implement lmcore.interfaces.PositionalEncoding",
        "(missing embed, rotation, attention_bias)",
        "subclass lmcore.interfaces.PositionalEncodingBase",
    )
