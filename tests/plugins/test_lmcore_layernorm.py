"""norm=layernorm: against torch and the formula, in float32 for bf16 input, in a model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lmcore import SpecError, build_model, parse_spec
from lmcore_layernorm import LayerNorm
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_model_runs_counts_and_is_causal,
)


def _formula(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdim=True)  # biased variance
    y = (x64 - mean) / torch.sqrt(var + eps) * w.double()
    return y if b is None else y + b.double()


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch_and_the_formula(bias: bool) -> None:
    torch.manual_seed(0)
    norm = LayerNorm(16, bias=bias, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
        if norm.bias is not None:
            norm.bias.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16) * 4 + 2
    expected = F.layer_norm(x, (16,), norm.weight, norm.bias, 1e-5)
    torch.testing.assert_close(norm(x), expected)
    torch.testing.assert_close(norm(x), _formula(x, norm.weight, norm.bias, 1e-5).float())


def test_eps_sits_inside_the_square_root_next_to_the_variance() -> None:
    norm = LayerNorm(2, eps=1.0)
    x = torch.tensor([[1.0, -1.0]])  # mean 0, variance 1
    # (x - 0) / sqrt(1 + 1): eps outside the root would give 1 / (1 + 1) = 0.5 instead.
    torch.testing.assert_close(norm(x), torch.tensor([[2**-0.5, -(2**-0.5)]]))


def test_output_has_zero_mean_and_unit_variance_at_init() -> None:
    torch.manual_seed(0)
    y = LayerNorm(64)(torch.randn(8, 64) * 10 + 3)
    torch.testing.assert_close(y.mean(-1), torch.zeros(8), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(8), atol=1e-4, rtol=0)


def test_state_dict_keys_and_init() -> None:
    with_bias, without = LayerNorm(8), LayerNorm(8, bias=False)
    assert set(with_bias.state_dict()) == {"weight", "bias"}
    assert set(without.state_dict()) == {"weight"}
    torch.testing.assert_close(with_bias.weight.detach(), torch.ones(8))
    torch.testing.assert_close(with_bias.bias.detach(), torch.zeros(8))


def test_bf16_input_is_computed_in_float32_and_returned_in_bf16() -> None:
    torch.manual_seed(0)
    norm = LayerNorm(64)
    x = (torch.randn(4, 64) * 30 + 100).to(torch.bfloat16)  # a large mean: bf16 maths would fail
    out = norm(x)
    assert out.dtype == torch.bfloat16
    expected = _formula(x.float(), norm.weight, norm.bias, 1e-5).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_follow_the_requested_dtype(dtype: torch.dtype) -> None:
    norm = LayerNorm(8, dtype=dtype)
    assert norm.weight.dtype == dtype and norm.bias is not None and norm.bias.dtype == dtype


def test_spec_writes_both_arguments_and_checks_eps() -> None:
    spec = parse_spec("cs336-tiny, norm=layernorm(bias=false)")
    assert str(spec.norm) == "layernorm(bias=false,eps=1e-05)"
    with pytest.raises(
        SpecError, match=r"argument 'eps' of norm 'layernorm' must be > 0.0, got 0.0"
    ):
        parse_spec("cs336-tiny, norm=layernorm(eps=0.0)")


@pytest.mark.parametrize("bias", [True, False])
def test_model_keys_per_norm_slot(bias: bool) -> None:
    model = build_model(f"cs336-tiny, norm=layernorm(bias={str(bias).lower()})")
    keys = set(model.state_dict())
    for name in ("layers.0.ln1", "layers.2.ln2", "ln_final"):
        assert f"{name}.weight" in keys
        assert (f"{name}.bias" in keys) == bias


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
@pytest.mark.parametrize(
    "args",
    [{"bias": True, "eps": 1e-05}, {"bias": False, "eps": 1e-05}],
    ids=["norm=layernorm", "norm=layernorm(bias=false)"],
)
def test_declared_params_and_flops_equal_the_module(
    args: dict[str, Any], shape: tuple[int, ...]
) -> None:
    assert_declared_counts("norm", "layernorm", args, shape)


@pytest.mark.parametrize(
    "args",
    [{"bias": True, "eps": 1e-05}, {"bias": False, "eps": 1e-05}],
    ids=["norm=layernorm", "norm=layernorm(bias=false)"],
)
def test_features_are_declared_and_compile_traces_the_whole_module(args: dict[str, Any]) -> None:
    assert_compile_traces_the_whole_module("norm", "layernorm", args)


@pytest.mark.parametrize(
    "spec", ["cs336-tiny, norm=layernorm", "cs336-tiny, norm=layernorm(bias=false)"]
)
def test_model_runs_counts_its_parameters_and_is_causal(spec: str) -> None:
    assert_model_runs_counts_and_is_causal(spec)
