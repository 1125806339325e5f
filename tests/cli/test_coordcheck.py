"""`lmcore coordcheck`: the table and plot for a small spec, and hostile inputs exit 2 with one
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcore.cli.main import main

SPEC = "vocab_size=64, context_length=8, d_model=32, num_layers=1, num_heads=2, d_ff=32"


def test_prints_both_tables_and_writes_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cc.png"
    args = ["coordcheck", SPEC, "--widths", "32,64", "--steps", "2", "--seq", "8"]
    assert main([*args, "--plot", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["muP:", "mup(base_width=32)", "32", "64"]
    assert any(line.startswith("SP ") for line in lines)
    assert lines[-2].startswith("largest |slope|: muP: mup(base_width=32")
    assert lines[-1] == f"plot: {out}" and out.stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--widths", "64"], "expected two or more comma-separated widths"),
        (["--widths", "64,32"], "widths must increase"),
        (["--widths", "a,b"], "expected two or more comma-separated widths"),
        (["--widths", "64,1000000"], "widths go up to 8192"),
        (["--lr", "-1"], "expected a learning rate in (0, 10]"),
        (["--steps", "0"], "expected a positive integer"),
    ],
)
def test_bad_options_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["coordcheck", SPEC, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_an_unknown_spec_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["coordcheck", "cs336-tiny, ffn=swigl"]) == 2
    assert "did you mean 'swiglu'" in capsys.readouterr().err


def test_a_spec_with_per_layer_values_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = SPEC.replace("num_layers=1", "num_layers=2") + ", d_ff[1]=64"
    assert main(["coordcheck", spec, "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "coordcheck takes a spec without per-layer values" in err[0]
    assert not (tmp_path / "x.png").exists()
