"""benchmarks/moe.py builds its peer right: transformers' Mixtral block, given lmcore's router
and experts, computes lmcore's mixture (the benchmark checks this before timing too)."""

from __future__ import annotations

import torch

from tests.helpers.runs import load_benchmark


def test_the_mixtral_block_computes_lmcores_mixture() -> None:
    bench = load_benchmark("moe")
    torch.manual_seed(0)
    ours = bench.lmcore_layer(16, 24, 4, 2, torch.float32)
    theirs = bench.mixtral_block(ours)
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)
    g = torch.randn_like(x)
    for step in (bench.training_step(ours, x, g), bench.training_step(theirs, x, g)):
        assert torch.isfinite(torch.as_tensor(step()))


def test_the_deepseek_v3_block_computes_lmcores_mixture_with_either_experts_implementation() -> (
    None
):
    bench = load_benchmark("moe")
    torch.manual_seed(0)
    ours = bench.deepseek_layer(16, 24, 8, 3, 4, 2, torch.float32)
    x = torch.randn(2, 9, 16)
    g = torch.randn_like(x)
    for experts in ("eager", "grouped_mm"):
        theirs = bench.deepseek_block(ours, experts)
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-6)
        for step in (bench.training_step(ours, x, g), bench.training_step(theirs, x, g)):
            assert torch.isfinite(torch.as_tensor(step()))
