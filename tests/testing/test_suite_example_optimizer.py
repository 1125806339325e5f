"""The example optimizer plugin, examples/lmcore-adafactor, held to the conformance kit
in-process: its module registered in a scoped registry beside the built-ins, every case run, its
boolean variants included (tox's py311-adafactor env installs it for real and runs its own
tests)."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from lmcore.registry import scoped_registry
from lmcore.testing import Settings, cases
from lmcore.train.recipe import Recipe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "lmcore-adafactor" / "lmcore_adafactor.py"
# Where the distribution is installed too (tox's py311-adafactor), its entry point steps aside.
INSTALLED = [ep.name for ep in entry_points(group="lmcore") if ep.name == "adafactor"]
CHECKS = ("groups", "lr", "resume", "quadratic", "bfloat16")


@pytest.fixture(scope="module")
def adafactor():
    spec = importlib.util.spec_from_file_location("lmcore_adafactor_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_kit_checks_it_and_each_flipped_flag(adafactor) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(adafactor, name="adafactor-file")
        found = cases(registry, kinds=["optimizer"], components=["adafactor"])
    assert {c.check.name for c in found} == set(CHECKS)
    assert {c.target.label for c in found} == {
        "optimizer:adafactor", "optimizer:adafactor(relative_step=true)",
        "optimizer:adafactor(scale_parameter=false)", "optimizer:adafactor(factored=false)",
    }  # fmt: skip


@pytest.mark.parametrize("check", CHECKS)
def test_the_example_optimizer_passes_every_check_of_the_kit(adafactor, check: str) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(adafactor, name="adafactor-file")
        found = [c for c in cases(registry, components=["adafactor"]) if c.check.name == check]
        assert found
        for case in found:
            assert case.skip_reason is None
            case.run(Settings())


def test_a_run_names_it_and_its_plugin(adafactor) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(adafactor, name="adafactor-file")
        recipe = Recipe.of("adafactor(beta1=0.9)", "wsd")
        record = recipe.record()["optimizer"]
    assert record["spec"].startswith("adafactor(beta1=0.9,")
    assert record["plugin"] == "adafactor-file"
