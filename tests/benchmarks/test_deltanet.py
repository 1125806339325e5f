"""benchmarks/deltanet.py times peers that compute lmcore's rule: transformers' torch
implementation (and flash-linear-attention's reference where installed) give lmcore's outputs
and final state on the benchmark's inputs, and each training step runs."""

from __future__ import annotations

import torch

from tests.helpers.runs import load_benchmark


def test_its_peers_compute_lmcores_gated_delta_rule() -> None:
    bench = load_benchmark("deltanet")
    xs = bench.make_inputs(1, 21, 2, 8)
    want, want_state = bench.lmcore_rule(8)(*xs)
    peers = bench.peers(8)
    assert "transformers" in peers
    for name, rule in peers.items():
        got, state = rule(*xs)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
        torch.testing.assert_close(state, want_state, rtol=1e-5, atol=1e-5, msg=name)
    grad = torch.randn(1, 21, 2, 8)
    for rule in (bench.lmcore_rule(8), *peers.values()):
        assert torch.isfinite(torch.as_tensor(bench.training_step(rule, xs, grad)()))
