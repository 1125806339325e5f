"""benchmarks/adamw.py compares like with like: twin copies of the same role groups and
gradients, and lmcore's AdamW and torch's foreach AdamW taking the same updates (the benchmark
checks this before timing too)."""

from __future__ import annotations

import torch

from tests.helpers.runs import load_benchmark


def test_the_two_optimizers_take_the_same_updates_on_twin_groups() -> None:
    bench = load_benchmark("adamw")
    groups = bench.make_groups("cs336-tiny")
    assert {g["role"] for g in groups} == {"embedding", "gain", "matrix", "head"}
    assert all(p.grad is not None for p in bench.params_of(groups))
    copy = bench.twin(groups)
    for p, q in zip(bench.params_of(groups), bench.params_of(copy), strict=True):
        assert torch.equal(p, q) and p is not q and q.grad is p.grad
    assert bench.update_difference(groups, 3) <= 1e-6
    before = [p.detach().clone() for p in bench.params_of(groups)]
    bench.lmcore_adamw(copy).step()  # the twins move, the originals do not
    assert all(torch.equal(a, b) for a, b in zip(before, bench.params_of(groups), strict=True))
    assert not torch.equal(bench.params_of(copy)[0], before[0])
