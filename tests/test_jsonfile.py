"""The versioned-JSON reader behind run.json, meta.json and trainer.json: every way a file can be
wrong is named with the file, and each caller's own error class and fix come through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmcore.errors import DataError, TrainError
from lmcore.jsonfile import read_versioned
from tests.helpers.errors import raises_naming


def read(file: Path, fix: str | None = None) -> dict[str, object]:
    return read_versioned(
        file, format="lmcore-x", version=2, what="an lmcore x", error=TrainError, fix=fix
    )


def test_a_file_of_the_format_and_version_is_returned_whole(tmp_path: Path) -> None:
    file = tmp_path / "x.json"
    body = {"format": "lmcore-x", "version": 2, "steps": [1, 2]}
    file.write_text(json.dumps(body))
    assert read(file) == body


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, r"cannot read {f}: \[Errno 2\] No such file or directory"),
        ("{", r"cannot read {f}: Expecting property name enclosed in double quotes"),
        (b"\xff", r"cannot read {f}: 'utf-8' codec can't decode byte 0xff"),
        ("[1, 2]", r"{f} is not an lmcore x \(no format 'lmcore-x'\)$"),
        ('{"format": "lmcore-run", "version": 2}', r"{f} is not an lmcore x \(no format 'lmcore-x'\)$"),
        ('{"format": "lmcore-x"}', r"{f} has lmcore-x version None; this lmcore reads version 2$"),
        ('{"format": "lmcore-x", "version": 3}', r"{f} has lmcore-x version 3; this lmcore reads version 2$"),
    ],
)  # fmt: skip
def test_each_fault_names_the_file(tmp_path: Path, text: str | bytes | None, message: str) -> None:
    file = tmp_path / "x.json"
    if isinstance(text, bytes):
        file.write_bytes(text)
    elif text is not None:
        file.write_text(text)
    with pytest.raises(TrainError, match=message.replace("{f}", str(file).replace("\\", "\\\\"))):
        read(file)


def test_the_fix_ends_every_message_and_the_callers_error_class_is_raised(tmp_path: Path) -> None:
    file = tmp_path / "meta.json"
    file.write_text('{"format": "lmcore-tokens", "version": 9}')
    with raises_naming(
        DataError, "meta.json has lmcore-tokens version 9", "this lmcore reads version 1"
    ) as e:
        read_versioned(
            file, format="lmcore-tokens", version=1, what="metadata", error=DataError, fix="redo"
        )
    assert str(e.value).endswith("; redo")
    file.write_text("{")
    with pytest.raises(DataError, match=r"cannot read .*meta.json: .*; redo$"):
        read_versioned(
            file, format="lmcore-tokens", version=1, what="metadata", error=DataError, fix="redo"
        )
