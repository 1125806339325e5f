"""The example mixer plugin, examples/lmcore-mingru, held to the conformance kit in-process: its
module registered in a scoped registry beside the built-ins, every case run (tox's py311-mingru
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
from lmcore.testing import Settings, cases

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lmcore-mingru" / "lmcore_mingru.py"
# Where the distribution is installed too (tox's py311-mingru), its entry point steps aside for the file.
INSTALLED = [ep.name for ep in entry_points(group="lmcore") if ep.name == "mingru"]


@pytest.fixture(scope="module")
def mingru():
    spec = importlib.util.spec_from_file_location("lmcore_mingru_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


# The mixer's own contract (mixes_causally, recurrent, state), the model-level cache check and
# the declarations, among every check the kit has for a mixer.
CHECKS = ("build", "forward", "gradients", "mixes_causally", "recurrent", "state", "cache",
          "params", "flops", "activations", "compile", "state_dict", "meta")  # fmt: skip


def test_the_kit_has_these_checks_and_more_for_the_example_mixer(mingru) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(mingru, name="mingru-file")
        names = {case.check.name for case in cases(registry, components=["mingru"])}
    assert set(CHECKS) <= names


@pytest.mark.parametrize("check", [*CHECKS, "others"])
def test_the_example_mixer_passes_every_check_of_the_kit(mingru, check: str) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(mingru, name="mingru-file")
        found = [
            case
            for case in cases(registry, components=["mingru"])
            if case.check.name == check or (check == "others" and case.check.name not in CHECKS)
        ]
        assert found or check == "others"
        for case in found:
            case.run(Settings(compile_backend="aot_eager"))


def test_a_hybrid_with_the_example_mixer_decodes_with_the_cache_as_without(mingru) -> None:
    with scoped_registry(disabled=INSTALLED) as registry:
        registry.register(mingru, name="mingru-file")
        torch.manual_seed(0)
        model = lmcore.build_model("cs336-tiny, vocab_size=256, mixer=mingru, mixer[1]=attention")
        assert isinstance(model.layers[0].attn, mingru.MinGRU)
        prompt = torch.randint(0, 256, (2, 4))
        cached = model.generate(prompt, 6, GREEDY)
        plain = model.generate(prompt, 6, GREEDY, cache=False)
    assert cached.shape == (2, 6) and torch.equal(cached, plain)
