"""`lmcore quantize`: a quantized copy of a checkpoint; its refusals, one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmcore
from lmcore.checkpoint import read_info
from lmcore.cli.main import main


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    return lmcore.build_model("cs336-tiny").save(tmp_path / "m.safetensors")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *said: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    for words in said:
        assert words in err, err


def test_writes_int8_and_int4_beside_the_checkpoint(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quantize", str(plain), "--int8"]) == 0
    out = capsys.readouterr().out
    assert "quant=int8(embedding=same)" in out and "m-int8.safetensors" in out
    assert read_info(tmp_path / "m-int8.safetensors").spec.endswith(",quant=int8(embedding=same)")
    assert (
        main(["quantize", str(plain), "--int4", "--out", str(tmp_path / "four.safetensors")]) == 0
    )
    info = read_info(tmp_path / "four.safetensors")
    assert info.spec.endswith(",quant=q4_1(embedding=same)")
    assert info.size < read_info(plain).size / 4  # 0.69 bytes a parameter instead of 4
    assert main(["generate", str(tmp_path / "four.safetensors"), "--prompt-ids", "1,2",
                 "--max-new-tokens", "3", "--temperature", "0"]) == 0  # fmt: skip


def test_refusals(plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, ["quantize", str(plain), "--int8", "--int4"], "give one of --int8 and --int4")
    _refused(capsys, ["quantize", str(plain)], "give one of --int8 and --int4")
    assert main(["quantize", str(plain), "--int8"]) == 0
    capsys.readouterr()
    done = str(tmp_path / "m-int8.safetensors")
    _refused(capsys, ["quantize", done, "--int4"], f"{done} is quantized already (int8)",
             "quantize the float checkpoint it came from")  # fmt: skip
    _refused(capsys, ["convert", "--to-hf", done, str(tmp_path / "hf")],
             f"{done} is quantized (int8)", "lmcore convert --to-gguf")  # fmt: skip
    _refused(capsys, ["convert", "--to-gguf", str(plain), str(tmp_path / "x.gguf"),
                      "--keep-quantized"], "--keep-quantized applies to --from-gguf only")  # fmt: skip
    _refused(capsys, ["quantize", str(plain), "--int8", "--out", str(plain)], str(plain))


def test_a_quantized_checkpoint_is_described_and_converted_as_quantized_and_not_trained(
    plain: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gguf", reason="needs the gguf extra: pip install 'lmcore-registry[gguf]'")
    assert main(["quantize", str(plain), "--int4"]) == 0
    four = str(tmp_path / "m-int4.safetensors")
    capsys.readouterr()
    assert main(["describe", four]) == 0
    out = capsys.readouterr().out
    assert "bytes on average, quant=q4_1(embedding=same)" in out
    assert "training: none (the stored quantized matrices take no gradients" in out
    assert "AdamW" not in out and "gradients  " not in out
    assert main(["convert", "--to-gguf", four, str(tmp_path / "m.gguf")]) == 0
    capsys.readouterr()
    back = tmp_path / "back.safetensors"
    assert main(["convert", "--from-gguf", str(tmp_path / "m.gguf"), str(back),
                 "--keep-quantized"]) == 0  # fmt: skip
    wrote = capsys.readouterr().out.splitlines()[-1]
    assert "matrices q4_1, the rest float32, lmcore checkpoint" in wrote, wrote
    _refused(capsys, ["train", four, "--data", str(tmp_path / "data"), "--out",
                      str(tmp_path / "run")], f"{four} is quantized (quant=q4_1(embedding=same))",
             "train the float checkpoint it came from")  # fmt: skip
    assert not (tmp_path / "run").exists()
