"""benchmarks/recompute.py compares like with like: both variants take the same gradients, and
the script runs end to end on a tiny model (not timed)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.runs import load_benchmark

TINY = "vocab_size=300, context_length=64, d_model=32, num_layers=2, num_heads=2"


def test_both_variants_take_the_same_gradients() -> None:
    bench = load_benchmark("recompute")
    plain = bench.gradients(TINY, None, size=2)
    for what in ("layers", "mixer,ffn"):
        again = bench.gradients(TINY, what, size=2)
        assert again.keys() == plain.keys() and plain
        for name in plain:
            torch.testing.assert_close(again[name], plain[name], rtol=1e-6, atol=1e-7)


def test_the_benchmark_runs_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("recompute")
    bench.main(["--spec", TINY, "--rounds", "1", "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("| variant | baseline RSS MiB | peak RSS MiB | step peak MiB |")
    assert [line.split(" | ")[0] for line in lines[3:]] == [
        "| none", "| --recompute layers", "| recompute / none"]  # fmt: skip
    ratios = [float(c) for c in lines[-1].strip(" |").split(" | ")[1:]]
    assert len(ratios) == 5 and all(r > 0 for r in ratios)
