"""`lmcore describe` and `lmcore run` given a checkpoint whose metadata is damaged: the loader's
one-line error, exit 2, no traceback (the loader itself: tests/model/test_reading.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmcore
from lmcore import CheckpointError
from lmcore.cli.main import main
from tests.helpers.models import edit, nest_components


def test_metadata_nested_too_deep_is_one_line_from_describe_and_run(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: a components JSON nested 50,000 deep gave RecursionError tracebacks in load,
    # describe and run.
    bad = edit(saved, tmp_path / "deep.safetensors", header=nest_components)
    with pytest.raises(CheckpointError, match="nested deeper than Python's parser follows") as e:
        lmcore.load(bad)
    for command in (["describe", str(bad)], ["run", str(bad), "--steps", "1"]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"lmcore {command[0]}: error: {e.value}\n"
