from __future__ import annotations

import pytest
import torch

from lmcore_rmsnorm import RMSNorm


def _formula(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt((x64**2).mean(-1, keepdim=True) + eps) * weight.double()


def test_rmsnorm_matches_the_formula() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(norm(x).double(), _formula(x, norm.weight, 1e-5))
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (16,), norm.weight, 1e-5))


def test_eps_sits_inside_the_square_root() -> None:
    norm = RMSNorm(4, eps=1.0)
    x = torch.full((1, 4), 1.0)
    # sqrt(mean(1) + 1) = sqrt(2); eps added outside would give 1/(1+1) = 0.5 instead.
    torch.testing.assert_close(norm(x), torch.full((1, 4), 2**-0.5))


def test_bf16_input_is_computed_in_float32_and_returned_in_bf16() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(64)
    x = (torch.randn(4, 64) * 30).to(torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    expected = _formula(x.float(), norm.weight, 1e-5).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_gain_starts_at_one_and_is_the_only_parameter() -> None:
    norm = RMSNorm(8)
    assert dict(norm.state_dict()).keys() == {"weight"}
    torch.testing.assert_close(norm.weight.detach(), torch.ones(8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_follow_the_requested_dtype(dtype: torch.dtype) -> None:
    assert RMSNorm(8, dtype=dtype).weight.dtype == dtype


@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 16)])
def test_gradients_match_the_formula_in_float64(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = (torch.randn(*shape, dtype=torch.float64) * 3).requires_grad_()
    grad = torch.randn(*shape, dtype=torch.float64)
    got = torch.autograd.grad(norm(x), (x, norm.weight), grad)
    want = torch.autograd.grad(_formula(x, norm.weight, 1e-5), (x, norm.weight), grad)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(norm, (x,))


def test_bf16_gradients_stay_bf16() -> None:
    norm = RMSNorm(8, dtype=torch.bfloat16)
    x = torch.randn(2, 8).to(torch.bfloat16).requires_grad_()
    norm(x).float().square().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    assert norm.weight.grad is not None and norm.weight.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_a_gradient_the_same_numbers_and_no_graph(dtype: torch.dtype) -> None:
    """Under no_grad / inference_mode the norm skips its autograd function: bitwise the same
    output, and nothing is recorded for a backward."""
    torch.manual_seed(0)
    norm = RMSNorm(32).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32))
    x = (torch.randn(2, 7, 32) * 5).to(dtype)
    trained = norm(x)
    assert trained.grad_fn is not None
    with torch.no_grad():
        plain = norm(x)
    with torch.inference_mode():
        inferred = norm(x)
    assert plain.grad_fn is None and plain.dtype == dtype
    assert torch.equal(plain, trained.detach()) and torch.equal(inferred, plain)


def test_zero_centered_is_gemmas_rmsnorm_with_its_zero_initial_weight() -> None:
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-6, zero_centered=True)
    assert torch.equal(norm.weight, torch.zeros(16))
    hf = GemmaRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
        hf.weight.copy_(norm.weight)
    x = torch.randn(2, 5, 16, requires_grad=True)
    torch.testing.assert_close(norm(x), hf(x), rtol=1e-6, atol=1e-6)
    g = torch.randn(2, 5, 16)
    mine = torch.autograd.grad(norm(x), [x, norm.weight], g)
    theirs = torch.autograd.grad(hf(x), [x, hf.weight], g)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_zero_centered_adds_one_to_the_weight_in_float32_under_bfloat16() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(64, zero_centered=True, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(0.01 * torch.randn(64))  # 1 + w mostly not a bfloat16
    x = torch.randn(4, 64).to(torch.bfloat16)
    xf = x.float()
    unit = xf / torch.sqrt(xf.square().mean(-1, keepdim=True) + 1e-5)
    in_float32 = (unit * (1.0 + norm.weight.float())).to(torch.bfloat16)
    rounded_gain = (unit * (1.0 + norm.weight).float()).to(torch.bfloat16)
    assert norm(x).dtype == torch.bfloat16
    assert torch.equal(norm(x), in_float32)
    assert not torch.equal(in_float32, rounded_gain)  # the test can tell the two apart
