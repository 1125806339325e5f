"""benchmarks/docmask.py compares like with like: every variant gives the same output and
gradients (the document-masked ones the float64 formula's, each document alone), and the
script runs end to end at a small size (not timed)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.runs import load_benchmark


def alone(q, k, v, grad, length):
    """Causal attention over each `length`-token document on its own, and its gradients."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs = []
    for s in range(0, q.shape[2], length):
        part = slice(s, s + length)
        scores = q[:, :, part] @ k[:, :, part].transpose(-1, -2) / math.sqrt(q.shape[-1])
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        outs.append(torch.softmax(scores.masked_fill(~causal, -math.inf), -1) @ v[:, :, part])
    out = torch.cat(outs, dim=2)
    return [out.detach(), *torch.autograd.grad(out, (q, k, v), grad.double())]


def test_the_masked_variants_give_each_document_alone() -> None:
    bench = load_benchmark("docmask")
    x = bench.inputs(tokens=384, documents=3, heads=2, head_dim=8, device="cpu")
    expected = alone(x["q"], x["k"], x["v"], x["grad"], 128)
    steps = bench.steps(x)
    for name in bench.VARIANTS[:3]:
        for got, want in zip(steps[name](), expected, strict=True):
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5, msg=name)
    one = steps["chunked, one document"]()[0]  # the row as one document differs
    assert (one[:, :, 128:] - expected[0][:, :, 128:]).abs().max() > 1e-3


def test_the_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("docmask")
    bench.main(["--tokens", "256", "--documents", "4", "--heads", "2", "--head-dim", "8",
                "--rounds", "1", "--threads", "1"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "| variant | step s | × chunked, documents |"
    assert [line.split(" | ")[0] for line in lines[3:]] == [
        f"| {name}" for name in bench.VARIANTS
    ]
    assert lines[3].endswith("| 1.00 |")


def test_tokens_must_split_into_equal_documents() -> None:
    bench = load_benchmark("docmask")
    with pytest.raises(SystemExit, match="--tokens 100 is not a multiple of --documents 8"):
        bench.inputs(tokens=100, documents=8, heads=1, head_dim=4, device="cpu")
