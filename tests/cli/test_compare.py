"""`lmcore compare`: the table of existing runs, ranked by loss or bits per byte, and what it
refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmcore.cli.main import main
from lmcore.train.config import TrainConfig
from lmcore.train.runs import read_metrics
from lmcore.train.sweep import compare_runs, table_markdown
from lmcore.train.trainer import train
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import PNG, one_line_error, sweep_config

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = sweep_config()


def test_compare_existing_runs(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    a, b = tmp_path / "a", tmp_path / "b"
    train(TINY_SPEC, tiny_data, a, CONFIG, echo=None)
    train(TINY_SPEC + ", ffn=silu", tiny_data, b, CONFIG, echo=None)
    rows = compare_runs([a, b])
    assert [r.label for r in rows] == ["a", "b"] and rows[1].spec.endswith(
        "ffn=silu,pos=rope(theta=10000.0),attn=sdpa"
    )
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(table_markdown(rows))
    assert (
        f"table: {tmp_path / 'cmp' / 'compare.md'} (and compare.json), validation curves: " in out
    )
    assert (tmp_path / "cmp" / "val_loss.png").read_bytes()[:8] == PNG


def test_compare_shows_the_recipe_of_each_run(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    config = replace(CONFIG, steps=3, eval_every=0)
    train(TINY_SPEC, tiny_data, a, config, echo=None)
    train(TINY_SPEC, tiny_data, b, replace(config, schedule="wsd(decay=0.5)"), echo=None)
    train(TINY_SPEC, tiny_data, c, replace(config, optimizer="torch_adamw"), echo=None)
    assert main(["compare", str(a), str(b), str(c), "--out", str(tmp_path / "cmp")]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == ("| run | recipe | parameters | train loss | val loss | Δ val | tokens/s | "
                        "wall time | status |")  # fmt: skip
    assert table[1] == "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    assert table[2].startswith("| `a` | `adamw · cosine` | 39,840 | ")
    assert table[3].startswith("| `b` | `adamw · wsd(decay=0.5,shape=sqrt)` | 39,840 | ")
    assert table[4].startswith("| `c` | `torch_adamw · cosine` | 39,840 | ")
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())["runs"]
    assert [(r["spec"], r["recipe"]) for r in rows] == [
        (rows[0]["spec"], "adamw · cosine"),
        (rows[0]["spec"], "adamw · wsd(decay=0.5,shape=sqrt)"),
        (rows[0]["spec"], "torch_adamw · cosine"),
    ]
    # runs of one recipe: a line under the table names it
    assert main(["compare", str(a), str(a)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("| run | parameters |")
    assert printed.endswith("|\n\nEvery run: optimizer `adamw`, schedule `cosine`.\n")


def test_compare_ranks_runs_by_bits_per_byte(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, other = tmp_path / "run", tmp_path / "other"
    train(TINY_SPEC, tiny_data, run, TrainConfig(steps=12, batch_size=4, eval_every=6,
          eval_batches=2, log_every=3, save_every=0, eval_bpb=True), echo=None)  # fmt: skip
    argv = ["train", TINY_SPEC.replace("d_model=32", "d_model=16"), "--data", str(tiny_data), "--out", str(other),
            "--steps", "3", "--batch-size", "4", "--eval-batches", "2", "--save-every", "0",
            "--eval-bpb"]  # fmt: skip
    assert main(argv) == 0
    assert " bpb " in capsys.readouterr().out
    bpb = {p: read_metrics(p)[-2]["val_bpb"] for p in (run, other)}
    assert main(["compare", str(other), str(run), "--sort", "val_bpb"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert (
        table[0]
        == "| run | parameters | train loss | val loss | val bpb | Δ val | tokens/s | wall time | status |"
    )
    best = min(bpb, key=lambda p: bpb[p])
    assert table[2].startswith(f"| `{best.name}` |") and f"| {bpb[best]:.3f} |" in table[2]
    assert main(["compare", str(other), "--sort", "val_bits"]) == 2
    assert "--sort 'val_bits': must be one of val_loss, val_bpb" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "DATA"], "is not a run directory: it has no run.json"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [str(tiny_data) if a == "DATA" else a for a in argv]
    assert message in one_line_error(capsys, argv)
    assert not (tmp_path / "r").exists()
