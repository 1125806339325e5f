"""`lmcore convert --merge ADAPTER --out MERGED`: the adapter folded into a plain checkpoint
with the adapted model's logits, which converts --to-hf and loads in transformers with them;
an unmerged adapter is refused by --to-hf and --to-gguf with the command that merges it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.adapting import adapt
from lmcore.cli.main import main
from tests.helpers.hf import HF_SPEC, HF_TOLERANCE


@pytest.fixture
def adapter(tmp_path: Path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    lmcore.build_model(HF_SPEC).save(tmp_path / "base.safetensors")
    model = adapt(tmp_path / "base.safetensors", "lora(rank=4)")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    ids = torch.randint(0, 97, (2, 12), generator=gen)
    with torch.no_grad():
        logits = model(ids)
    return model.save(tmp_path / "adapter.safetensors"), ids, logits


def test_merge_writes_a_plain_checkpoint_with_the_adapted_logits(adapter, tmp_path, capsys) -> None:
    path, ids, logits = adapter
    out = tmp_path / "merged.safetensors"
    assert main(["convert", "--merge", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"spec: {lmcore.parse_spec(HF_SPEC)}\n" in printed and "plain lmcore checkpoint" in printed
    plain = lmcore.load(out)
    assert plain.spec.adapter is None
    with torch.no_grad():
        torch.testing.assert_close(plain(ids), logits, rtol=1e-5, atol=1e-5)
    # --to-hf of the merged file loads in transformers with the same logits.
    transformers = pytest.importorskip("transformers")
    assert main(["convert", "--to-hf", str(out), str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        theirs = hf(ids).logits
    assert (theirs - logits).abs().max().item() < HF_TOLERANCE * 10


@pytest.mark.parametrize("way", ["--to-hf", "--to-gguf"])
def test_an_unmerged_adapter_is_refused_with_the_merge_command(adapter, tmp_path, capsys, way) -> None:
    path = adapter[0]
    assert main(["convert", way, str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{path} has an adapter; merge it into a plain checkpoint first: lmcore convert --merge {path}" in err


def test_merge_needs_out_and_an_adapter(adapter, tmp_path, capsys) -> None:
    path = adapter[0]
    assert main(["convert", "--merge", str(path)]) == 2
    assert "--merge ADAPTER and --out MERGED.safetensors go together" in capsys.readouterr().err
    base = tmp_path / "base.safetensors"
    assert main(["convert", "--merge", str(base), "--out", str(tmp_path / "m.safetensors")]) == 2
    assert "this model has no adapter to merge" in capsys.readouterr().err
