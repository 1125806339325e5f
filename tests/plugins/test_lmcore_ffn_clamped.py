"""ffn=clamped_swiglu, gpt-oss's expert: against transformers' GptOssExperts on the same weights
(its interleaved gate/up columns split into w1 and w3), its hand-written backward against
autograd through the formula (at the clamps' bounds too), its declarations and the kit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmcore import build_model, get_registry
from lmcore.errors import SpecError
from lmcore.testing import CHECKS, Case, Settings, Target
from lmcore_ffn import ClampedSwiGLU
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_model_runs_counts_and_is_causal,
)

SMALL = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=48"


def _formula(x: torch.Tensor, ffn: ClampedSwiGLU, alpha: float, limit: float) -> torch.Tensor:
    """The formula in plain autograd ops."""
    a = x @ ffn.w1.weight.T + ffn.w1.bias
    b = x @ ffn.w3.weight.T + ffn.w3.bias
    g = torch.clamp(a, max=limit)
    hidden = (torch.clamp(b, -limit, limit) + 1) * (g * torch.sigmoid(alpha * g))
    return hidden @ ffn.w2.weight.T + ffn.w2.bias


def _noisy(ffn: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in ffn.parameters():
            p.add_(0.5 * torch.randn_like(p))  # biases off zero, products past the clamps
    return ffn


def test_it_is_gpt_oss_expert_in_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        hidden_size=16, intermediate_size=24, num_local_experts=1, swiglu_limit=1.5
    )
    hf = GptOssExperts(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_()
    ffn = ClampedSwiGLU(16, 24, alpha=1.702, limit=1.5, bias=True)
    with torch.no_grad():  # gate_up (E, d, 2·ff): columns gate0, up0, gate1, up1, ...
        ffn.w1.weight.copy_(hf.gate_up_proj[0][:, ::2].T)
        ffn.w3.weight.copy_(hf.gate_up_proj[0][:, 1::2].T)
        ffn.w1.bias.copy_(hf.gate_up_proj_bias[0][::2])
        ffn.w3.bias.copy_(hf.gate_up_proj_bias[0][1::2])
        ffn.w2.weight.copy_(hf.down_proj[0].T)
        ffn.w2.bias.copy_(hf.down_proj_bias[0])
    x = torch.randn(7, 16)
    with torch.no_grad():
        ones = torch.ones(7, 1)
        expected = hf(x, torch.zeros(7, 1, dtype=torch.long), ones)
        a = x @ ffn.w1.weight.T + ffn.w1.bias
    assert (a > 1.5).any() and (x @ ffn.w3.weight.T + ffn.w3.bias).abs().gt(1.5).any()
    torch.testing.assert_close(ffn(x), expected, rtol=1e-6, atol=1e-6)


def test_the_backward_is_autograds_through_the_formula_at_the_bounds_too() -> None:
    torch.manual_seed(0)
    alpha, limit = 1.702, 1.0
    ffn = _noisy(ClampedSwiGLU(8, 12, alpha=alpha, limit=limit, bias=True).double())
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    # one input row lands w1 x and w3 x on the bounds exactly (gradient passes there, as torch's)
    with torch.no_grad():
        ffn.w1.bias[0] = limit - (x[0, 0] @ ffn.w1.weight[0])
        ffn.w3.bias[1] = -limit - (x[0, 0] @ ffn.w3.weight[1])
    x.requires_grad_()
    got, expected = ffn(x), _formula(x, ffn, alpha, limit)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(got)
    params = [x, *ffn.parameters()]
    for mine, theirs in zip(
        torch.autograd.grad(got, params, g), torch.autograd.grad(expected, params, g), strict=True
    ):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)


def test_keys_defaults_and_the_arguments_refused() -> None:
    assert set(ClampedSwiGLU(8, 16).state_dict()) == {"w1.weight", "w2.weight", "w3.weight"}
    spec = build_model(f"{SMALL}, ffn=clamped_swiglu", device="meta").spec
    assert str(spec.ffn) == "clamped_swiglu(alpha=1.702,limit=7.0,bias=false)"
    with pytest.raises(SpecError, match=r"limit.*must be > 0.0, got -1.0"):
        build_model(f"{SMALL}, ffn=clamped_swiglu(limit=-1.0)", device="meta")
    takes = r"no argument 'approximate'; it takes: alpha, bias, d_ff, limit"
    with pytest.raises(SpecError, match=takes):
        build_model(f"{SMALL}, ffn=clamped_swiglu(approximate=tanh)", device="meta")


@pytest.mark.parametrize("shape", COUNT_SHAPES)
@pytest.mark.parametrize("args", [{}, {"bias": True}], ids=["plain", "bias"])
def test_declared_params_and_flops_equal_the_module(
    args: dict[str, Any], shape: tuple[int, ...]
) -> None:
    assert_declared_counts("ffn", "clamped_swiglu", args, shape)


def test_compile_traces_the_whole_module() -> None:
    assert_compile_traces_the_whole_module("ffn", "clamped_swiglu", {"bias": True})


def test_model_runs_counts_its_parameters_and_is_causal() -> None:
    assert_model_runs_counts_and_is_causal("cs336-tiny, ffn=clamped_swiglu(bias=true, limit=0.5)")


@pytest.mark.parametrize("overrides", [(("bias", True), ("limit", 0.5))])
def test_it_passes_the_conformance_kit(overrides: tuple[tuple[str, Any], ...]) -> None:
    target = Target(get_registry().get("ffn", "clamped_swiglu"), overrides)
    for check in CHECKS:
        if check.applies_to(target):
            for variant in check.variants:
                Case(check, target, variant).run(Settings(compile_backend="aot_eager"))
