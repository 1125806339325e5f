"""`lmcore build`: the canonical spec and the parameter count, spec errors with a caret, --save
(a seeded model, a checkpoint's dtype converted) and where it cannot save: a full disk, a
directory, a missing one (exit 2, one line, nothing half written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from lmcore import parse_spec
from lmcore.cli.main import main
from tests.helpers.runs import CHECKPOINT_SPEC, PROBE_SPEC, disk_full_after, mib

FULL = "; nothing was replaced: free space there, or write elsewhere"


def test_build_prints_the_canonical_spec_and_parameter_count(capsys) -> None:
    assert main(["build", "cs336-tiny, pos=nope"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(parse_spec("cs336-tiny, pos=nope")), "parameters: 1,403,328"]


def test_build_reports_spec_errors_with_a_caret_and_exit_code_2(capsys) -> None:
    assert main(["build", "tinystories, pos=rop"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(
        "lmcore build: error: no installed plugin provides pos 'rop' (did you mean 'rope'?)"
    )
    assert err[-2:] == ["  tinystories, pos=rop", "                   ^^^"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="CUDA is available here")
def test_cuda_on_a_cpu_build_exits_2(capsys) -> None:
    assert main(["build", "cs336-tiny", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith(
        "lmcore build: error: device 'cuda': CUDA is not available in this torch build"
    )


def test_a_path_that_cannot_be_written_exits_2_with_one_line(capsys, tmp_path) -> None:
    target = tmp_path / "missing-dir" / "m.safetensors"
    assert main(["build", "cs336-tiny", "--save", str(target)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"lmcore build: error: {tmp_path / 'missing-dir'}") and err.count("\n") == 1
    )
    assert err.rstrip().endswith("No such file or directory")


def test_build_save_writes_a_seeded_model_that_loads_with_the_same_logits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.safetensors"
    assert main(["build", CHECKPOINT_SPEC, "--save", str(path), "--seed", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [str(parse_spec(CHECKPOINT_SPEC)), "parameters: 1,403,328"]
    assert out[2] == f"saved: {path} ({mib(path)}, float32)"
    torch.manual_seed(3)
    fresh = lmcore.build_model(CHECKPOINT_SPEC)
    ids = torch.randint(0, 10_000, (2, 16))
    assert torch.equal(lmcore.load(path)(ids), fresh(ids))


def test_build_from_a_checkpoint_can_convert_its_dtype(
    checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    half = checkpoint.with_name("bf16.safetensors")
    assert main(["build", str(checkpoint), "--dtype", "bfloat16", "--save", str(half)]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith(", bfloat16)")
    assert lmcore.read_info(half).dtype == "bfloat16"
    before, after = lmcore.load(checkpoint), lmcore.load(half)
    assert torch.equal(after.lm_head.weight, before.lm_head.weight.bfloat16())


def test_build_save_onto_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.safetensors"
    disk_full_after(monkeypatch, 0)
    assert main(["build", PROBE_SPEC, "--save", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"lmcore build: error: {out}: No space left on device{FULL}\n"
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary one


def test_save_onto_a_directory_names_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: --save/--from-hf OUT onto a directory named a hidden temporary file.
    assert main(["build", PROBE_SPEC, "--save", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"lmcore build: error: {tmp_path}: is a directory; save to a file, e.g. "
        f"{tmp_path / 'model.safetensors'}\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_canonical_spec_longer_than_a_file_name_builds(capsys) -> None:
    long = str(
        parse_spec(
            "vocab_size=300, context_length=32, d_model=32, num_layers=1, num_heads=2, "
            "ffn=moe(num_experts=4, shared=swiglu)"
        )
    )
    assert len(long) > 255
    assert main(["build", long, "--device", "meta"]) == 0  # was: File name too long
    assert capsys.readouterr().out.splitlines()[0] == long


def test_a_trillion_layers_exit_2_with_one_line(capsys) -> None:
    assert main(["build", "tinystories, num_layers=1000000000000", "--device", "meta"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "num_layers=1,000,000,000,000" in err[0]  # was: MemoryError


def test_the_tables_temporaries_count_against_max_bytes(capsys) -> None:
    """cs336-tiny at context 2e7: weights and tables are 1.20 GiB, under 1.3 GiB, but the
    tables' positions and angles take the build to 1.87 GiB (it used 1.95 GB)."""
    argv = ["build", "cs336-tiny, context_length=20000000", "--max-bytes", "1.3GiB"]
    assert main(argv) == 2
    [err] = capsys.readouterr().err.splitlines()
    peak = 4 * 1_403_328 + 8 * 20_000_000 * 8 + 4 * 20_000_000 * 9
    assert f"({peak:,} bytes)" in err and "context_length=20,000,000" in err
