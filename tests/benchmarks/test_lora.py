"""benchmarks/lora.py compares like with like: lmcore's LoRA and PEFT's, given the same initial
matrices, train the same trainable tensors and take the same steps (the losses agree); the
script runs end to end on a tiny model (not timed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from tests.helpers.runs import load_benchmark

TINY = ("vocab_size=300,context_length=32,d_model=32,num_layers=2,num_heads=4,num_kv_heads=2,"
        "tie_embeddings=true,pos=rope(theta=100000.0)")  # fmt: skip


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path: Path = lmcore.build_model(TINY).save(tmp_path / "tiny.safetensors")
    return path


def test_lmcore_and_peft_lora_take_the_same_steps(tiny: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft", reason="needs the test extra's peft: pip install -e '.[test]'")
    from lmcore.hf.convert import convert_to_hf

    bench = load_benchmark("lora")
    convert_to_hf(tiny, tmp_path / "hf")
    torch.manual_seed(0)
    ours = bench.lmcore_model(str(tiny), "lmcore-lora", 4)
    theirs = bench.peft_model(str(tmp_path / "hf"), 4)
    assert bench.copy_lora_into_peft(ours, theirs) == 2 * 7  # q, k, v, o, gate, up, down
    count = [sum(p.numel() for p in m.parameters() if p.requires_grad) for m in (ours, theirs)]
    assert count[0] == count[1] > 0
    a = [loss for loss, _ in bench.train_steps(ours, bench.lmcore_loss(ours),
                                               bench.batches(300, 2, 16, 4))]  # fmt: skip
    b = [loss for loss, _ in bench.train_steps(theirs, bench.peft_loss(theirs),
                                               bench.batches(300, 2, 16, 4))]  # fmt: skip
    assert a == pytest.approx(b, rel=1e-4)
    assert a[-1] != a[0]  # it trained
    base = lmcore.load(tiny)
    plain = {k: v for k, v in ours.state_dict().items() if ".adapter." not in k}
    for name, t in base.state_dict().items():
        assert torch.equal(plain[name], t), name  # the base frozen


def test_the_benchmark_runs_tiny(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("lora")
    bench.main(["--checkpoint", str(tiny), "--batch", "2", "--context", "16", "--steps", "1",
                "--warmup", "1", "--rounds", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert "| run | trainable | s/step | tokens/s | peak memory (VmHWM) |" in out
    assert "| lmcore-lora |" in out and "| lmcore-full |" in out
    assert "full / LoRA: memory" in out and "1 timed steps after 1, 2 rounds;" in out
    try:
        import peft  # noqa: F401
    except ImportError:
        assert "the PEFT comparison is skipped" in out
    else:
        assert "| peft-lora |" in out and "PEFT / lmcore LoRA time:" in out
        each = out.split("PEFT / lmcore LoRA time, each round: ")[1].splitlines()[0]
        assert len(each.split(", ")) == 2 and all(r.endswith("×") for r in each.split(", "))


@pytest.mark.parametrize("flag", ["--rounds", "--steps", "--warmup"])
def test_counts_below_their_least_are_refused(flag: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        load_benchmark("lora").main([flag, "-1"])
    assert e.value.code == 2
    assert f"{flag} must be at least" in capsys.readouterr().err


def test_kernels_replace_the_checkpoints_items_and_keep_its_weights(tiny: Path,
                                                                     tmp_path: Path) -> None:
    bench = load_benchmark("lora")
    out = bench.with_kernels(str(tiny), "attn=chunked, norm=rmsnorm(eps=1e-06)",
                             tmp_path / "k.safetensors")  # fmt: skip
    base, swapped = lmcore.load(tiny), lmcore.load(out)
    spec = str(swapped.spec)
    assert str(base.spec).replace("attn=sdpa", "attn=chunked(block_size=128)").replace(
        "norm=rmsnorm(eps=1e-05)", "norm=rmsnorm(eps=1e-06)") == spec  # nothing else changed
    for (k, a), (j, b) in zip(base.state_dict().items(), swapped.state_dict().items(),
                              strict=True):  # fmt: skip
        assert k == j and torch.equal(a, b)
    kernel = lmcore.load(bench.with_kernels(str(tiny), "attn=chunked", tmp_path / "c.safetensors"))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():  # another kernel of the same attention: the same logits
        torch.testing.assert_close(kernel(ids), base(ids), rtol=1e-4, atol=1e-5)
    with pytest.raises(SystemExit, match="give key=value items, not a preset"):
        bench.with_kernels(str(tiny), "tinystories", tmp_path / "x.safetensors")
