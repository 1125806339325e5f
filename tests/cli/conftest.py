"""Fixtures of the command-line tests: a checkpoint `lmcore build --save` wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcore.cli.main import main
from tests.helpers.runs import CHECKPOINT_SPEC


@pytest.fixture
def checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """m.safetensors, a model of CHECKPOINT_SPEC saved by `lmcore build --save`."""
    path = tmp_path / "m.safetensors"
    assert main(["build", CHECKPOINT_SPEC, "--save", str(path)]) == 0
    capsys.readouterr()
    return path
