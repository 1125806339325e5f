"""`lmcore sweep` on the command line: the table it prints, a failed run reported while the
others go on, a sweep file checked key by key, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from lmcore import Component, scoped_registry
from lmcore.cli.main import main
from lmcore.model.roles import GAIN, Role
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import one_line_error

pytestmark = pytest.mark.usefixtures("single_thread")


def test_sweep_on_the_command_line(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s"
    argv = ["sweep", TINY_SPEC, "--vary", "ffn=silu", "--data", str(tiny_data), "--out", str(out),
            "--steps", "10", "--batch-size", "8", "--eval-batches", "2", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| `baseline` |" in printed and "| `ffn=silu` |" in printed
    assert f"validation curves: {out / 'val_loss.png'}" in printed


class BoomNorm(nn.Module):
    """A norm whose forward raises: a run that fails with an exception."""

    def __init__(self, d_model: int, device: Any = None, dtype: Any = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def parameter_roles(self) -> dict[str, Role]:
        return {"weight": GAIN}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom in the norm")


def test_a_failed_run_is_reported_and_the_others_go_on(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with scoped_registry() as registry:
        registry.add(
            Component(kind="norm", name="boom", build=BoomNorm, params=lambda d_model: d_model)
        )
        argv = ["sweep", TINY_SPEC, "--vary", "norm=boom", "--vary", "pos=nope", "--data",
                str(tiny_data), "--out", str(tmp_path / "s"), "--steps", "5", "--batch-size",
                "8", "--eval-batches", "1", "--device", "cpu"]  # fmt: skip
        assert main(argv) == 1
    captured = capsys.readouterr()
    assert "lmcore sweep: error: norm=boom, seed 0: RuntimeError: boom in the norm" in captured.err
    assert "| `norm=boom` | 20,640 | – | – | 0/1 done; seed 0: failed: RuntimeError: boom" in (
        captured.out
    )
    assert "| `pos=nope` | 20,640 | " in captured.out and captured.out.count(" | 1/1 done |") == 2


def test_the_sweep_file_is_checked_key_by_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "s.toml"
    file.write_text('base = "cs336-tiny"\nvariants = ["pos=nope"]\nseed = 3\n')
    assert main(["sweep", str(file)]) == 2
    assert (
        f"lmcore sweep: error: {file}: unknown key 'seed' (did you mean 'seeds'?); the keys are "
        "base, variants, data, out, seeds, match, train, launcher" in capsys.readouterr().err
    )
    file.write_text('base = "cs336-tiny"\nvariants = ["pos=nope"]\n[train]\nlearning_rate = 1\n')
    assert main(["sweep", str(file)]) == 2
    assert "[train]: unknown key 'learning_rate'" in capsys.readouterr().err
    file.write_text('base = "cs336-tiny"\nvariants = ["pos=nope"]\n')
    assert main(["sweep", str(file)]) == 2
    assert (
        f"lmcore sweep: error: --data DIR, --out SWEEP are needed (neither on the command line nor in {file})"
        in capsys.readouterr().err
    )
    assert main(["sweep", "cs336-tiny", "--vary", "pos=nope", "--data", "d", "--out", "o",
                 "--slurm-extra", "account"]) == 2  # fmt: skip
    assert "--slurm-extra 'account': expected KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sweep", "ckpt.safetensors", "--vary", "norm=none", "--data", "DATA", "--out", "s"],
         "BASE 'ckpt.safetensors' looks like a checkpoint path; a sweep trains every model from "
         "the start"),
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


def test_a_sweep_file_not_utf8_and_an_edited_sweep_json_are_one_line(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    from tests.helpers.errors import assert_naming

    monkeypatch.chdir(tmp_path)
    Path("bad.toml").write_bytes(b'# caf\xe9\nbase = "cs336-tiny"\nvariants = ["norm=none"]\n')
    assert_naming(one_line_error(capsys, ["sweep", "bad.toml"]), "bad.toml: not UTF-8 at byte 5")
    sw = Path("sw")
    sw.mkdir()
    (sw / "sweep.toml").write_text(f'base = "{TINY_SPEC}"\nvariants = ["pos=nope"]\n'
                                   f'data = "{tiny_data}"\nout = "sw"\n')  # fmt: skip
    valid = '{"format": "lmcore-sweep", "data": "d", '
    (sw / "sweep.json").write_text(valid + "edited by hand")
    assert_naming(one_line_error(capsys, ["sweep", "--resume", "sw"]),
                  f"sw/sweep.json: not JSON at line 1, column {len(valid) + 1}",
                  "undo the edit")  # fmt: skip


def test_a_sweep_varies_the_recipe_with_seeds_and_match(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s"
    argv = ["sweep", TINY_SPEC, "--vary", "schedule=wsd", "--vary", "optimizer=torch_adamw",
            "--seeds", "2", "--match", "params", "--data", str(tiny_data), "--out", str(out),
            "--steps", "4", "--batch-size", "8", "--eval-batches", "1", "--device", "cpu"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    table = printed[printed.index(next(x for x in printed if x.startswith("| variant |"))) :]
    assert table[0] == ("| variant | recipe | matched | non-embedding params | val loss | "
                        "Δ val [95% CI] | status |")  # fmt: skip
    assert table[2].startswith("| `baseline` | `adamw · cosine` | d_ff 64 (the target) | 20,640 |")
    assert table[3].startswith("| `schedule=wsd` | `adamw · wsd(decay=0.2,shape=sqrt)` | d_ff 64 "
                               "(as is, +0.00%) | 20,640 | ")  # fmt: skip
    assert table[4].startswith("| `optimizer=torch_adamw` | `torch_adamw · cosine` | ")
    assert all(row.count("[") == 1 and row.endswith(" | 2/2 done |") for row in table[3:5])
    assert sorted(p.name.rsplit("-", 2)[0] for p in out.glob("*-seed1")) == [
        "baseline", "optimizer-torch_adamw", "schedule-wsd"]  # fmt: skip


def test_a_sweep_file_varies_the_recipe_and_a_bad_recipe_fails_before_training(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    Path("s.toml").write_text(
        f'base = "{TINY_SPEC}"\nvariants = ["schedule=wsd(decay=0.5), lr=2e-3"]\n'
        f'data = "{tiny_data}"\nout = "sw"\n[train]\nsteps = 3\nbatch_size = 4\n'
        'eval_batches = 1\noptimizer = "torch_adamw"\ndevice = "cpu"\n'
    )
    assert main(["sweep", "s.toml"]) == 0
    printed = capsys.readouterr().out
    assert "| `schedule=wsd(decay=0.5), lr=2e-3` | `torch_adamw · wsd(decay=0.5,shape=sqrt)` |" in (
        printed
    )
    assert "| `baseline` | `torch_adamw · cosine` |" in printed
    run = next(Path("sw").glob("schedule-wsd-*-seed0"))
    config = json.loads((run / "run.json").read_text())["config"]
    assert (config["lr"], config["schedule"], config["optimizer"]) == (
        2e-3, "wsd(decay=0.5,shape=sqrt)", "torch_adamw")  # fmt: skip
    for variants, message in (
        ('["lr=-1"]', "--vary 'lr=-1': --lr -1.0: must be a number > 0"),
        ('["steps=5"]', "--vary 'steps=5': steps is a training option every variant shares"),
        ('["optimiser=adamw"]', "unknown key 'optimiser' (did you mean 'optimizer'?)"),
    ):
        Path("bad.toml").write_text(f'base = "{TINY_SPEC}"\nvariants = {variants}\n'
                                    f'data = "{tiny_data}"\nout = "bad"\n')  # fmt: skip
        assert main(["sweep", "bad.toml"]) == 2
        assert message in capsys.readouterr().err
        assert not Path("bad").exists()  # refused before the sweep's directory exists
