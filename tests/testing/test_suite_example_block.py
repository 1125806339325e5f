"""The example block plugin, examples/lmcore-ngpt, held to the conformance kit in-process: its
module registered in a scoped registry beside the built-ins, every case run (tox's py311-ngpt
env installs it for real and runs its own tests)."""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.model.generate import GREEDY
from lmcore.registry import scoped_registry
from lmcore.testing import CaseSkipped, Settings, cases
from tests.helpers.errors import raises_naming

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lmcore-ngpt" / "lmcore_ngpt.py"
# Where the distribution is installed too (tox's py311-ngpt), its entry point steps aside for the file.
INSTALLED = [ep.name for ep in entry_points(group="lmcore") if ep.name == "ngpt"]


@pytest.fixture(scope="module")
def ngpt():
    spec = importlib.util.spec_from_file_location("lmcore_ngpt_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_example_block_passes_every_check_of_the_kit(ngpt) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(ngpt, name="ngpt-file")
        found = cases(registry, components=["ngpt"])
        names = {case.check.name for case in found}
        assert {"build", "forward", "gradients", "keys", "residual", "cache", "params",
                "flops", "activations", "compile", "state_dict", "meta"} <= names  # fmt: skip
        for case in found:
            if case.check.name == "coordinates":  # nGPT's stream is on the unit sphere: no muP
                assert case.skip_reason == ("block:ngpt declares 'nomup': muP's rules do not "
                                            "hold for it, and it refuses them")  # fmt: skip
                continue
            case.run(Settings(compile_backend="aot_eager"))


def test_a_model_with_the_example_block_decodes_with_the_cache_as_without(ngpt) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(ngpt, name="ngpt-file")
        torch.manual_seed(0)
        model = lmcore.build_model("cs336-tiny, block=ngpt")
        prompt = torch.randint(0, 10_000, (1, 4))
        cached = model.generate(prompt, 6, GREEDY)
        plain = model.generate(prompt, 6, GREEDY, cache=False)
    assert torch.equal(cached, plain)


def test_run_refuses_a_case_that_pytest_would_skip_and_says_why(ngpt) -> None:
    with scoped_registry(autoload=False) as registry:  # no built-in parts to build it with
        registry.register(ngpt, name="ngpt-file")
        [case, *_] = cases(registry, components=["ngpt"])
        assert case.skip_reason is not None
        with raises_naming(
            CaseSkipped,
            "test_build[block:ngpt] cannot run",
            "the check builds a model around block:ngpt",
            "the registry lacks the default norm 'rmsnorm'",
        ) as caught:
            case.run()
        assert caught.value.reason == case.skip_reason and caught.value.case is case
