"""The checks of attention kernels (the float64 reference, stability, causality, masks, biases,
grouped-query heads, the query scale, soft-capping and the sliding window) catch their planted
bugs, each with a message that names it."""

from __future__ import annotations

import pytest

from lmcore import Component
from tests.helpers.kit import (
    assert_planted_bug_beside_the_builtins_fails,
    assert_planted_bug_fails_its_check,
    beside_builtins_caught_by,
    planted_bugs_caught_by,
)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


@pytest.mark.parametrize("component", planted_bugs_caught_by("attention_checks"))
def test_each_planted_bug_fails_its_check_and_names_it(
    pytester: pytest.Pytester, component: str
) -> None:
    assert_planted_bug_fails_its_check(pytester, component)


@pytest.mark.parametrize(
    ("check", "component", "facts"), beside_builtins_caught_by("attention_checks")
)
def test_each_planted_bug_beside_the_builtins_fails_its_check(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    assert_planted_bug_beside_the_builtins_fails(check, component, facts)
