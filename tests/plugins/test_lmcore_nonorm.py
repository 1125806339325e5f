"""norm=none: the identity, with no parameters, in every norm slot."""

from __future__ import annotations

import pytest
import torch

from lmcore import build_model
from lmcore_nonorm import NoNorm
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_model_runs_counts_and_is_causal,
)


def test_none_is_the_identity_with_no_parameters() -> None:
    x = torch.randn(2, 3, 8).to(torch.bfloat16)
    norm = NoNorm()
    assert norm(x) is x
    assert norm.state_dict() == {} and list(norm.parameters()) == []


def test_norm_none_model_has_no_norm_keys_and_runs() -> None:
    model = build_model("cs336-tiny, norm=none")
    assert not [k for k in model.state_dict() if "ln" in k]
    logits = model(torch.randint(0, 10000, (2, 16)))
    assert logits.shape == (2, 16, 10000) and torch.isfinite(logits).all()


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
def test_declared_params_and_flops_equal_the_module(shape: tuple[int, ...]) -> None:
    assert_declared_counts("norm", "none", {}, shape)


def test_features_are_declared_and_compile_traces_the_whole_module() -> None:
    assert_compile_traces_the_whole_module("norm", "none", {})


@pytest.mark.parametrize("spec", ["cs336-tiny, norm=none", "cs336-tiny, norm=none, block=postnorm"])
def test_model_runs_counts_its_parameters_and_is_causal(spec: str) -> None:
    assert_model_runs_counts_and_is_causal(spec)
