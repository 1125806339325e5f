"""benchmarks/muon.py compares like with like: both optimizers get the model's hidden matrices
(role `matrix`, every one of them) from the same start, and the updates it measures equal."""

from __future__ import annotations

import torch

import lmcore
from tests.helpers.runs import load_benchmark


def test_it_steps_the_same_matrices_to_the_same_values() -> None:
    bench = load_benchmark("muon")
    params = bench.matrices("cs336-tiny", "cpu")
    model = lmcore.build_model("cs336-tiny")
    assert [tuple(p.shape) for p in params] == [
        tuple(p.shape)
        for n, p in model.named_parameters()
        if n.startswith("layers.") and p.ndim == 2
    ]  # q, k, v, out, w1, w2, w3 of each layer: no embedding, head or gain
    opts = bench.optimizers(params)
    assert [g["update"] for g in opts["lmcore"][0].param_groups] == ["muon"]
    for _, ps in opts.values():
        assert all(torch.equal(p, q) for p, q in zip(ps, params, strict=True))
    assert bench.max_relative_difference(params, steps=2) == 0.0
    assert bench.shapes(params) == "12×64×64, 6×128×64, 3×64×128"
