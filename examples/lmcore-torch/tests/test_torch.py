"""lmcore-torch against lmcore's built-ins: same keys, same numbers (the contract tests come
from `--lmcore-conformance`, see addopts in pyproject.toml)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lmcore
from lmcore_torch import TorchRMSNorm, TorchSDPA, TorchSwiGLU

BUILTINS = "tinystories, context_length=32"
FUSED = f"{BUILTINS}, norm=torch_rmsnorm, ffn=torch_swiglu, attn=torch_sdpa"


def builtin(kind: str, name: str, **kwargs: object) -> torch.nn.Module:
    module: torch.nn.Module = lmcore.get_registry().get(kind, name).component.create(**kwargs)
    return module


def test_the_three_components_are_found_through_the_entry_point() -> None:
    registry = lmcore.get_registry()
    for kind, name in (("attn", "torch_sdpa"), ("norm", "torch_rmsnorm"), ("ffn", "torch_swiglu")):
        entry = registry.get(kind, name)
        assert (entry.provenance.dist, entry.provenance.module) == ("lmcore-torch", "lmcore_torch")


def test_a_model_loads_the_builtins_weights_and_gives_the_same_logits() -> None:
    torch.manual_seed(0)
    ours = lmcore.build_model(BUILTINS)
    fused = lmcore.build_model(FUSED)
    assert fused.state_dict().keys() == ours.state_dict().keys()
    fused.load_state_dict(ours.state_dict(), strict=True)
    ids = torch.randint(0, 10_000, (2, 32))
    torch.testing.assert_close(fused(ids), ours(ids), rtol=1e-4, atol=1e-4)
    grads = []
    for model in (ours, fused):
        model.zero_grad()
        model(ids).logsumexp(-1).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-3, atol=1e-5, msg=name)


def _end_aligned(sq: int, sk: int) -> torch.Tensor:
    return torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("sq,sk", [(7, 7), (3, 9), (1, 5)])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_the_builtin_sdpa(heads, kv_heads, sq, sk, causal) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, heads, sq, 8, requires_grad=True)
    k = torch.randn(2, kv_heads, sk, 8, requires_grad=True)
    v = torch.randn(2, kv_heads, sk, 8, requires_grad=True)
    mask = torch.rand(2, 1, sq, sk) > 0.3
    mask[..., 0] = True
    bias = torch.randn(heads, sq, sk)
    for kwargs in ({}, {"mask": mask}, {"bias": bias}, {"mask": mask, "bias": bias}):
        got = TorchSDPA()(q, k, v, causal=causal, **kwargs)
        want = builtin("attn", "sdpa")(q, k, v, causal=causal, **kwargs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(got)
        a = torch.autograd.grad(got, (q, k, v), g)
        b = torch.autograd.grad(want, (q, k, v), g)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_bias_that_needs_a_gradient_gets_one() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    bias = torch.randn(2, 5, 5, requires_grad=True)
    sdpa = builtin("attn", "sdpa")
    (g_ours,) = torch.autograd.grad(TorchSDPA()(q, k, v, causal=True, bias=bias).sum(), bias)
    (g_ref,) = torch.autograd.grad(sdpa(q, k, v, causal=True, bias=bias).sum(), bias)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-4, atol=1e-5)


def test_fully_masked_rows_are_zeros() -> None:
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    out = TorchSDPA()(q, k, v, causal=False, mask=mask)
    assert bool((out[:, :, 1] == 0).all()) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_the_builtin(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    ours, theirs = builtin("norm", "rmsnorm", d_model=16), TorchRMSNorm(16)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16))
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = (torch.randn(3, 5, 16) * 3).to(dtype)
    assert theirs(x).dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(theirs(x), ours(x), rtol=tol, atol=tol)


def test_swiglu_matches_the_builtin_with_the_same_keys() -> None:
    torch.manual_seed(0)
    ours, theirs = builtin("ffn", "swiglu", d_model=16, d_ff=48), TorchSwiGLU(16, 48)
    assert theirs.state_dict().keys() == ours.state_dict().keys()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(theirs(x), ours(x))


def test_attention_flops_are_counted_on_the_cpu_as_declared() -> None:
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    with FlopCounterMode(display=False) as counter:
        TorchSDPA()(q, k, v, causal=True)
    declared = (
        lmcore.get_registry()
        .get("attn", "torch_sdpa")
        .component.count_flops(num_heads=4, head_dim=16, seq_len=8, kv_len=8)
    )
    assert counter.get_total_flops() == declared == 4 * 4 * 8 * 8 * 16
