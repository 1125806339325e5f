"""What every command shares (lmcore.cli.common): a checkpoint wherever a spec is taken, one
path error for all, each resolved once, the version warning on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import lmcore
import lmcore.blueprint
from lmcore.cli.main import main


@pytest.mark.parametrize("command", ["build", "describe", "run"])
def test_a_bad_checkpoint_path_exits_2(command: str, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.safetensors"
    assert main([command, str(missing)]) == 2
    assert capsys.readouterr().err == f"lmcore {command}: error: {missing}: no such file\n"


@pytest.mark.parametrize(
    "argv",
    [["describe"], ["build"], ["build", "--device", "meta"], ["run", "--steps", "1", "--seq", "4"]],
)
def test_each_command_resolves_a_checkpoint_once(
    argv: list[str], checkpoint: Path, resolutions: list[str], capsys
) -> None:
    assert main([argv[0], str(checkpoint), *argv[1:]]) == 0
    assert resolutions == [lmcore.read_info(checkpoint).spec]


def test_a_version_warning_goes_to_stderr(checkpoint: Path, capsys) -> None:
    with safe_open(str(checkpoint), "pt") as f:
        meta = dict(f.metadata())
    table = json.loads(meta["lmcore.components"])
    table["pos"]["version"] = "0.0.9"
    meta["lmcore.components"] = json.dumps(table)
    save_file(load_file(str(checkpoint)), str(checkpoint), metadata=meta)
    assert main(["describe", str(checkpoint)]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"lmcore describe: warning: {checkpoint}: pos 'nope' was saved with lmcore-registry "
        f"0.0.9, and lmcore-registry {lmcore.__version__} is installed. Loading it anyway; if its "
        "tensors no longer fit, or to reproduce it exactly, pip install lmcore-registry==0.0.9\n"
    )
