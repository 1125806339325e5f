"""The checks together: every one is shown failing by some planted bug, and correct components
pass every check."""

from __future__ import annotations

import pytest

from tests.helpers.kit import (
    EXPECTED,
    NODE,
    PLANTED_BESIDE_BUILTINS,
    failures,
    planted_bugs_caught_by,
    run_kit,
)
from tests.testing.test_adapter_checks import PLANTED as ADAPTER_PLANTED
from tests.testing.test_quant_checks import PLANTED as QUANT_PLANTED
from tests.testing.test_recipe_checks import PLANTED as RECIPE_PLANTED

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


def test_every_check_is_shown_failing_by_some_planted_bug() -> None:
    from lmcore.testing import CHECKS

    caught = {
        test.split("[")[0].removeprefix("test_") for tests in EXPECTED.values() for test in tests
    }
    caught.add("build")  # test_module_checks: a module that is not a positional encoding
    caught.add("activations")  # test_declaration_checks: a wrong activations declaration
    caught.add("cache")  # test_runtime_checks: a component that breaks the cache
    caught |= {"mixes_causally", "recurrent", "state"}  # test_mixer_checks: planted mixers
    caught |= {name for name, *_ in PLANTED_BESIDE_BUILTINS}  # the tests beside the builtins
    caught |= {check for check, *_ in RECIPE_PLANTED}  # test_recipe_checks: optimizers, schedules
    caught |= {check for check, *_ in ADAPTER_PLANTED}  # test_adapter_checks: adapters
    caught.add("coordinates")  # test_coord_checks: a hidden matrix declared a scalar
    caught |= {check for check, *_ in QUANT_PLANTED}  # test_quant_checks: weight formats
    assert caught == {c.name for c in CHECKS}
    # Each planted bug is run by the tests of the one module of checks that catches it.
    modules = {c.fn.__module__.rsplit(".", 1)[-1] for c in CHECKS}
    by_module = [name for module in sorted(modules) for name in planted_bugs_caught_by(module)]
    assert sorted(by_module) == sorted(EXPECTED)


@pytest.mark.parametrize("component", ["good-norm", "good-attn", "good-rotary"])
def test_correct_components_pass_every_check(pytester: pytest.Pytester, component: str) -> None:
    outcomes = run_kit(pytester, "--lmcore-component", component)
    # The activations check needs a declaration, which these components leave out (optional);
    # the cache, coordinates and documents checks a model around them, which the planted-only
    # registry cannot build.
    skipped = {k for k, v in outcomes.items() if v == "skipped"}
    assert sorted(k.split("[")[0] for k in skipped) == [
        NODE + "test_activations",
        NODE + "test_cache",
        NODE + "test_coordinates",
        *([] if component == "good-norm" else [NODE + "test_documents"]),  # attn, pos, mixer
    ]
    assert outcomes and {v for k, v in outcomes.items() if k not in skipped} == {"passed"}, (
        failures(outcomes)
    )
