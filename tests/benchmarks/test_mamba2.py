"""benchmarks/mamba2.py times a peer that computes lmcore's layer: transformers' Mamba2Mixer,
loaded with lmcore's weights, gives lmcore's outputs on the benchmark's inputs (chunks that do
not divide the sequence, two groups), and each training step runs and reaches every weight."""

from __future__ import annotations

import torch

from tests.helpers.runs import load_benchmark


def test_its_peer_computes_lmcores_mamba2_layer() -> None:
    bench = load_benchmark("mamba2")
    ours, peer = bench.layers(d_model=16, d_state=8, head_dim=8, groups=2, chunk=5)
    x, grad = torch.randn(2, 13, 16), torch.randn(2, 13, 16)
    with torch.no_grad():
        want = bench.as_layer(ours)(x)
        torch.testing.assert_close(bench.as_layer(peer)(x), want, rtol=1e-5, atol=1e-5)
    for module in (ours, peer):
        loss = bench.training_step(bench.as_layer(module), module, x, grad)()
        assert torch.isfinite(torch.as_tensor(loss))
        assert all(p.grad is not None and p.grad.abs().max() > 0 for p in module.parameters())
