"""`lmcore ladder` on the command line: the plan it prints, a tiny ladder trained, fitted and
re-fitted by `--report`, a re-run that trains nothing twice, and what it refuses in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmcore import Component, scoped_registry
from lmcore.cli.main import main
from lmcore.ladder.sizing import size_ladder
from tests.cli.test_sweep import BoomNorm  # a norm whose forward raises
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import one_line_error

pytestmark = pytest.mark.usefixtures("single_thread")

SIZES = ["--vary", "pos=nope", "--rungs", "3", "--factor", "1.5", "--tokens-per-param", "0.02",
         "--batch-size", "4"]  # fmt: skip
TRAIN = ["--eval-batches", "1", "--eval-every", "0", "--save-every", "0", "--device", "cpu"]


def test_plan_prints_every_rung_and_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ladder", TINY_SPEC, *SIZES, "--plan", "--out", str(tmp_path / "l")]) == 0
    printed = capsys.readouterr().out
    plan = size_ladder(TINY_SPEC, ["pos=nope"], rungs=3, factor=1.5, tokens_per_param=0.02,
                       batch_size=4)  # fmt: skip
    for rung in plan.rungs:
        b = rung.baseline
        assert f"| {rung.index} | `baseline` | {b.shape} | {b.params:,} |" in printed
        assert f"| {rung.steps:,} |" in printed
    assert printed.count("`pos=nope`") == 3
    assert "3 rungs, non-embedding parameters × 1.5 per rung; 0.02 tokens per parameter" in printed
    assert not (tmp_path / "l").exists()


def test_a_tiny_ladder_trains_fits_and_reports(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "l"
    argv = ["ladder", TINY_SPEC, *SIZES, *TRAIN, "--data", str(tiny_data), "--out", str(out),
            "--bootstrap", "0"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| `baseline` |" in printed and "| `pos=nope` |" in printed
    assert (
        f"table: {out / 'ladder.md'} (and fits.json, points.json), plot: {out / 'ladder.png'}"
        in printed
    )
    for name in ("ladder.md", "fits.json", "points.json", "ladder.png"):
        assert (out / name).is_file()
    points = json.loads((out / "points.json").read_text())["points"]
    assert len(points) == 6 and {p["rung"] for p in points} == {0, 1, 2}
    fits = json.loads((out / "fits.json").read_text())
    assert [v["variant"] for v in fits["variants"]] == ["baseline", "pos=nope"]
    table = (out / "ladder.md").read_text()
    assert table.split("\n", 2)[2] in printed  # the file holds the printed table

    assert main(argv) == 0  # again: every run kept, the same fit
    again = capsys.readouterr()
    assert (again.out + again.err).count("done before, kept") == 6
    assert (out / "ladder.md").read_text() == table

    assert main(["ladder", "--report", str(out), "--bootstrap", "0", "--sort", "multiplier"]) == 0
    report = capsys.readouterr().out
    assert "| `pos=nope` |" in report and "[0/" not in report  # nothing trained
    ranked = json.loads((out / "fits.json").read_text())["variants"]
    assert ranked == sorted(ranked, key=lambda v: -v["multiplier"]["value"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--factor", "1"], "--factor 1.0: must be a number above 1"),
        (["--factor", "-3"], "--factor -3.0: must be a number above 1"),
        (["--rungs", "2"], "--rungs 2: must be an integer from 3 to 24"),
        (["--rungs", "12", "--factor", "1000"], "would have 2.06e+37 non-embedding parameters"),
        (["--vary", "poss=nope"], "unknown key 'poss' (did you mean 'pos'?)"),
        (["--vary", "num_layers=6"], "--vary 'num_layers=6' sets num_layers, which the ladder"),
        (["--steps", "10"], "--steps is the ladder's to choose"),
        (["--max-bytes", "100KB"], "rung 0 (d_model 32, 2 layers, 2 heads, d_ff 64, 20,640 non-"),
        (["--sort", "los"], "--sort 'los': must be one of multiplier, loss (did you mean 'loss'?)"),
        (["--target-flops", "-1"], "--target-flops -1.0: must be a finite number above 0"),
    ],
)
def test_hostile_inputs_exit_2_with_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["ladder", TINY_SPEC, "--vary", "pos=nope", "--tokens-per-param", "1", "--plan", *extra]
    assert message in one_line_error(capsys, argv)


def test_what_is_not_a_ladder_or_not_a_ladder_command_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "sweep.json").write_text("{}")
    err = one_line_error(capsys, ["ladder", "--report", str(tmp_path)])
    assert "not a ladder's directory, no ladder.json there (it is a sweep's" in err
    err = one_line_error(capsys, ["ladder", "--report", str(tmp_path / "none")])
    assert "no such directory" in err
    err = one_line_error(capsys, ["ladder", TINY_SPEC, "--report", str(tmp_path)])
    assert "re-fits that ladder as it was run: give none of BASE" in err
    err = one_line_error(capsys, ["ladder", TINY_SPEC, "--vary", "pos=nope"])
    assert "give one of --tokens-per-param R" in err
    err = one_line_error(capsys, ["ladder", TINY_SPEC, "--vary", "pos=nope",
                                  "--tokens-per-param", "1"])  # fmt: skip
    assert "--data DIR and --out LADDER are needed to train a ladder" in err
    err = one_line_error(capsys, ["ladder", "--tokens-per-param", "1"])
    assert "give a BASE spec (rung 0) and --vary ITEMS" in err


def test_failed_runs_are_reported_and_the_baseline_still_fitted(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with scoped_registry() as registry:
        registry.add(
            Component(kind="norm", name="boom", build=BoomNorm, params=lambda d_model: d_model)
        )
        argv = ["ladder", TINY_SPEC, "--vary", "norm=boom", *SIZES[2:], *TRAIN, "--data",
                str(tiny_data), "--out", str(tmp_path / "l"), "--bootstrap", "0"]  # fmt: skip
        assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.count("lmcore ladder: error: norm=boom, seed 0: ") == 3
    assert "boom in the norm" in captured.err
    assert "rung 2, norm=boom, seed 0: failed: RuntimeError: boom in the norm: no point" in (
        captured.out
    )
    assert "| `baseline` |" in captured.out  # the fit of what finished
