"""The checks of a component's declarations against its module (params and buffers, flops,
activations) catch their planted bugs, each with a message that names it."""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor

from tests.helpers.errors import assert_naming, raises_naming
from tests.helpers.kit import (
    NODE,
    Norm,
    WithBuiltins,
    assert_planted_bug_fails_its_check,
    failures,
    norm,
    norm_activations,
    planted_bugs_caught_by,
    run_kit,
)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.usefixtures("kit_warmed_up")


@pytest.mark.parametrize("component", planted_bugs_caught_by("declaration_checks"))
def test_each_planted_bug_fails_its_check_and_names_it(
    pytester: pytest.Pytester, component: str
) -> None:
    assert_planted_bug_fails_its_check(pytester, component)


def test_a_right_activations_declaration_passes(pytester: pytest.Pytester) -> None:
    good = norm("counted", Norm, activations=norm_activations)
    outcomes = run_kit(pytester, "--lmcore-component", "counted", plugin=WithBuiltins(good))
    assert outcomes[NODE + "test_activations[norm:counted]"] == "passed"


def test_a_wrong_activations_declaration_fails_and_names_it(pytester: pytest.Pytester) -> None:
    # Forgets rms, the (..., 1) tensor: off by 4 bytes a token.
    bad = norm(
        "forgetful", Norm, activations=lambda batch, seq_len, d_model: 8 * batch * seq_len * d_model
    )
    outcomes = run_kit(pytester, "--lmcore-component", "forgetful", plugin=WithBuiltins(bad))
    assert failures(outcomes).keys() == {NODE + "test_activations[norm:forgetful]"}
    assert_naming(
        outcomes[NODE + "test_activations[norm:forgetful]"],
        "declares activations(d_model=64, batch=1, seq_len=8) = 4,096 bytes",
        "in the model 'vocab_size=97, context_length=32, d_model=64, num_layers=2, num_heads=4, "
        "num_kv_heads=4, d_ff=128, norm=forgetful'",
        "autograd keeps 4,128 bytes for it (layers.*.ln1",
        "measured on the meta device as lmcore describe --measure does",
        "fix the activations function of the Component",
    )


def test_a_component_that_counts_a_tensor_the_next_layer_saves_fails() -> None:
    """Rows agree one by one, yet the total does not: the norm saves its own output, which the
    attention projections save too, and declares it."""
    from lmcore.testing import ConformanceError, cases

    class SavesOutput(Norm):
        def forward(self, x: Tensor) -> Tensor:
            return torch.sigmoid(self.normalise(x)).to(x.dtype)  # sigmoid keeps its output

    def declared(batch: int, seq_len: int, d_model: int) -> int:
        sigmoid_out = 4 * batch * seq_len * d_model  # float32; in float32 models also the output
        return norm_activations(batch, seq_len, d_model) + sigmoid_out

    registry = WithBuiltins(norm("greedy", SavesOutput, activations=declared)).registry
    [case] = [c for c in cases(registry, components=["greedy"]) if c.check.name == "activations"]
    with raises_naming(
        ConformanceError,
        re.compile(r"keeps [\d,]+ bytes where the declarations add up to [\d,]+"),
        "the component's output is probably also saved by the next layer",
    ):
        case.run()


def test_a_wrong_modules_declaration_fails_and_names_it(pytester: pytest.Pytester) -> None:
    # A norm is one module object (no submodules); this one says three.
    bad = norm("crowded", Norm, modules=lambda d_model: 3)
    outcomes = run_kit(pytester, "--lmcore-component", "crowded", plugin=WithBuiltins(bad))
    assert failures(outcomes).keys() == {NODE + "test_params[norm:crowded]"}
    assert_naming(
        outcomes[NODE + "test_params[norm:crowded]"],
        "declares modules(d_model=64) = 3",
        "the built module is 1 module objects",
        "fix the modules function of the Component",
    )


def test_a_right_modules_declaration_passes(pytester: pytest.Pytester) -> None:
    good = norm("counted_modules", Norm, modules=lambda: 1)
    outcomes = run_kit(pytester, "--lmcore-component", "counted_modules", plugin=WithBuiltins(good))
    assert outcomes[NODE + "test_params[norm:counted_modules]"] == "passed"
