"""`lmcore quickstart`: it prepares the data once and prints the falling loss; what it refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmcore.cli.main import main
from lmcore.train import quickstart as qs
from lmcore.train.runs import read_run
from tests.helpers.models import tiny_corpus
from tests.helpers.runs import one_line_error

pytestmark = pytest.mark.usefixtures("single_thread")


def test_quickstart_prepares_once_and_prints_the_falling_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tiny_corpus(tmp_path / "stdlib")  # stands in for the standard library: fast
    monkeypatch.setattr(qs, "stdlib", lambda: fake)
    monkeypatch.chdir(tmp_path)
    assert main(["quickstart", "--steps", "12", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("quickstart: a small model learns Python from this Python's")
    assert lines[2] == (
        f"  lmcore data prepare {fake} --ext .py --exclude site-packages --exclude test "
        "--vocab-size 2048 --out data/stdlib-2k"
    )
    assert lines[3] == (
        f"  lmcore train '{qs.QUICKSTART_SPEC}' --data data/stdlib-2k --out runs/quickstart "
        "--steps 12 --batch-size 16 --lr 0.003 --eval-every 20 --eval-batches 4 --save-every 0"
    )
    assert (
        "data: data/stdlib-2k: train.bin, val.bin (uint16), train.starts.bin, val.starts.bin, "
        "tokenizer.json, meta.json"
    ) in lines
    vals = [float(m[1]) for m in re.finditer(r"^step +\d+  val (\d+\.\d+)", out, re.M)]
    assert len(vals) == 2 and vals[1] < vals[0] - 1
    assert read_run("runs/quickstart")["status"]["state"] == "done"
    # again: the data is reused, the run goes to the next free directory
    assert main(["quickstart", "--steps", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "data: data/stdlib-2k holds the standard library already; reusing it" in out
    assert "run: runs/quickstart-2  (tag L4-d128-rmsnorm-swiglu-rope-" in out
    meta = json.loads((tmp_path / "data/stdlib-2k/meta.json").read_text())
    assert meta["sources"][0]["path"] == str(fake)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["quickstart", "--data", "DATA"], "holds other prepared data (277 tokens from"),
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
