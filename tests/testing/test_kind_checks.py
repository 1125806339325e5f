"""The contracts particular to one kind (per_token, a block's keys and residual stream, a
positional encoding's features and relative positions) catch their planted bugs."""

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


@pytest.mark.parametrize("component", planted_bugs_caught_by("kind_checks"))
def test_each_planted_bug_fails_its_check_and_names_it(
    pytester: pytest.Pytester, component: str
) -> None:
    assert_planted_bug_fails_its_check(pytester, component)


@pytest.mark.parametrize(("check", "component", "facts"), beside_builtins_caught_by("kind_checks"))
def test_each_planted_bug_beside_the_builtins_fails_its_check(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    assert_planted_bug_beside_the_builtins_fails(check, component, facts)
