"""Which files a source contributes and how they are read: in chunks that encode like the whole
text, cut before whitespace, or outside added tokens where text has no whitespace; links that
loop or point to nothing are named as such."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from lmcore.data import EOT
from lmcore.data.preparing import prepare
from lmcore.data.sources import find_files, forced_cut, read_chunks, safe_cut
from lmcore.errors import DataError
from tests.helpers.errors import raises_naming
from tests.helpers.runs import unicode_text, write


@given(text=unicode_text(), chunk=st.integers(1, 40))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chunks_encode_like_the_whole_text(tok: Tokenizer, text: str, chunk: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d) / "t.txt", text)
        pieces = list(read_chunks(path, chunk_bytes=chunk))
    assert "".join(pieces) == text
    chunked = [i for p in pieces for i in tok.encode(p, add_special_tokens=False).ids]
    assert chunked == tok.encode(text, add_special_tokens=False).ids


def test_safe_cut_is_before_whitespace_that_follows_a_non_space() -> None:
    assert safe_cut("ab cd\nef") == 5  # prefers the newline
    assert safe_cut("ab cd") == 2
    assert safe_cut("ab  \n") == 2  # a whitespace run: cut where it starts
    assert safe_cut("   \n\n") == 0 and safe_cut("abc") == 0
    text = "x" * 50 + " y"
    assert list(read_chunks(write(Path(tempfile.mkdtemp()) / "t", text), 8)) == ["x" * 50, " y"]


def test_which_files_a_directory_contributes(tmp_path: Path) -> None:
    root = tmp_path / "src"
    for name in (
        "b.txt", "a.md", "sub/c.PY", "sub/notes.csv", ".hidden.txt", ".git/x.txt",
        "test/t.txt", "sub/test/u.txt", "sub/skip_me.txt", "out/train.txt",
    ):  # fmt: skip
        write(root / name, "x")
    explicit = write(tmp_path / "extra.csv", "y")
    files = find_files(
        [root, explicit, root / "b.txt"],
        extensions=[".txt", "md", ".py"],
        exclude=["test", "*skip*"],
        skip=root / "out",
    )
    rel = [f.path.relative_to(tmp_path).as_posix() for f in files]
    # Sorted, recursive, by extension (any case), hidden and excluded paths and the output
    # directory left out; an explicit file is read whatever its extension, each file once.
    assert rel == ["src/a.md", "src/b.txt", "src/sub/c.PY", "extra.csv"]
    assert [f.source for f in files] == [0, 0, 0, 1]


def test_a_link_that_loops_is_not_called_missing(tmp_path: Path) -> None:
    # The probe: a self-looping symlink "does not exist (did you mean 'a.txt'?)".
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "self").symlink_to("self")
    (tmp_path / "gone").symlink_to("nowhere.txt")
    with raises_naming(DataError, f"source '{tmp_path}/self'", "symbolic link",
                       "part of a loop of links", "links to 'self'",
                       "fix or remove the link"):  # fmt: skip
        prepare([tmp_path / "self"], tmp_path / "out")
    with pytest.raises(DataError, match=r"'.*/gone' is a symbolic link that points to nothing"):
        prepare([tmp_path / "gone"], tmp_path / "out")


def test_a_run_without_a_cut_point_is_cut_outside_added_tokens(tmp_path: Path) -> None:
    text = "x" * 50 + EOT + "y" * 40
    path = tmp_path / "t.txt"
    path.write_text(text)
    pieces = list(read_chunks(path, 8, max_run=56))
    assert "".join(pieces) == text
    assert all(len(p) <= 56 + 8 for p in pieces)  # bounded, where the whole has no cut point
    assert sum(p.count(EOT) for p in pieces) == 1  # never split
    assert forced_cut("a" * 20 + EOT + "b" * 3) == 20  # before the token spanning the end
    assert forced_cut(EOT + "b") == len(EOT)  # after one that starts the text
