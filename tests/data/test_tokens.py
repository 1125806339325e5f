"""What `data prepare` and `TokenData.open` refuse, and how: the hostile probe's reproductions
(files outside the data directory, metadata that does not fit its files, misleading advice),
each with its exact message; and text without whitespace, read in bounded pieces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from lmcore.cli.main import main
from lmcore.data import TokenData, prepare
from lmcore.data.prepare import LONG_RUNS, RUN_PIECE, _training_text
from lmcore.data.sources import SourceFile, forced_cut, read_chunks
from lmcore.errors import DataError
from tests.helpers import tiny_corpus

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checks")
    prepare([tiny_corpus(root / "text")], root / "d", vocab_size=300, progress=False)
    return root / "d"


def copy_with_meta(data: Path, out: Path, change) -> Path:
    out.mkdir()
    for p in data.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    meta = json.loads((out / "meta.json").read_text())
    change(meta)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


FIX = "run: lmcore data prepare SOURCE... --out {} --force"


@pytest.mark.parametrize("how", ["absolute", "relative", "symlink"])
def test_split_files_outside_the_directory_are_refused(
    data: Path, tmp_path: Path, how: str
) -> None:
    # The probe: a meta.json whose split file was an absolute path outside the data directory
    # was trained on.
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes((data / "train.bin").read_bytes())
    name = {"absolute": str(outside), "relative": "../elsewhere.bin", "symlink": "link.bin"}[how]

    def point(meta: dict) -> None:
        meta["splits"]["train"]["file"] = name

    out = copy_with_meta(data, tmp_path / "d", point)
    if how == "symlink":
        (out / "link.bin").symlink_to(outside)
    with pytest.raises(DataError, match=re.escape(
        f"{out / 'meta.json'}: splits.train.file is {name!r}, which resolves to {str(outside)!r}, "
        f"outside the data directory {str(out)!r}; a data directory holds its own files: "
        f"{FIX.format(out)}"
    )):  # fmt: skip
        TokenData.open(out)


def test_metadata_that_does_not_fit_its_tokenizer_is_named(data: Path, tmp_path: Path) -> None:
    # The probe: meta vocab 100 with a 300-token tokenizer trained and reported "vocabulary 100";
    # eot_id ≥ vocab_size was said "not to fit dtype uint16".
    real = TokenData.open(data).vocab_size

    def small(meta: dict) -> None:
        meta["vocab_size"] = 100

    out = copy_with_meta(data, tmp_path / "a", small)
    with pytest.raises(DataError, match=re.escape(
        f"{out / 'meta.json'} says vocab_size 100 with <|endoftext|> = 0, but tokenizer.json has "
        f"{real} tokens with <|endoftext|> = 0: the files do not belong together; "
        f"{FIX.format(out)}"
    )):  # fmt: skip
        TokenData.open(out)

    def eot(meta: dict) -> None:
        meta["eot_id"] = meta["vocab_size"]

    out = copy_with_meta(data, tmp_path / "b", eot)
    with pytest.raises(DataError, match=re.escape(
        f"{out / 'meta.json'}: eot_id {real} is not an id of the vocabulary (vocab_size {real}: "
        f"ids 0 to {real - 1}); {FIX.format(out)}"
    )):  # fmt: skip
        TokenData.open(out)


def test_a_model_vocabulary_too_small_for_the_data_gets_advice_that_works(data: Path) -> None:
    # The probe: a spec vocab of 200 was told to prepare the data with --vocab-size 200, which
    # prepare rejects (it needs at least 257).
    tokens = TokenData.open(data)
    with pytest.raises(DataError, match=re.escape(
        f"use vocab_size={tokens.vocab_size} in the spec (e.g. \"tinystories, vocab_size="
        f"{tokens.vocab_size}\") (a prepared vocabulary has at least 257 tokens: the 256 bytes "
        "and <|endoftext|>)"
    )):  # fmt: skip
        tokens.check(context_length=8, vocab_size=200)
    with pytest.raises(DataError, match=r"or prepare the data with --vocab-size 260$"):
        tokens.check(context_length=8, vocab_size=260)


def test_a_link_that_loops_is_not_called_missing(tmp_path: Path) -> None:
    # The probe: a self-looping symlink "does not exist (did you mean 'a.txt'?)".
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "self").symlink_to("self")
    (tmp_path / "gone").symlink_to("nowhere.txt")
    with pytest.raises(DataError, match=re.escape(
        f"source '{tmp_path}/self' is a symbolic link that is part of a loop of links (it links "
        "to 'self'); fix or remove the link"
    )):  # fmt: skip
        prepare([tmp_path / "self"], tmp_path / "out")
    with pytest.raises(DataError, match=r"'.*/gone' is a symbolic link that points to nothing"):
        prepare([tmp_path / "gone"], tmp_path / "out")


def test_a_vocabulary_larger_than_the_text_can_fill_is_not_reserved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: --vocab-size 1000000000 aborted the process in Rust (exit 134) although the
    # range check lets up to 2**32 through. No text of B bytes has more than B merges.
    text = tiny_corpus(tmp_path / "text")
    code = main(["data", "prepare", str(text), "--out", str(tmp_path / "d"), "--vocab-size",
                 "1000000000"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert TokenData.open(tmp_path / "d").vocab_size < 10_000


# --- text without whitespace ---------------------------------------------------------------


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


def test_text_without_spaces_is_read_and_trained_on_in_bounded_pieces(tmp_path: Path) -> None:
    # 300 KiB of letters with no space: pieces of at most about a megabyte (here max_run), and
    # the trainer gets at most LONG_RUNS characters of such runs, in RUN_PIECE pieces.
    path = tmp_path / "a.txt"
    path.write_text("abcdefghij" * 3 + "1" + "q" * (300 << 10) + " end")

    class Bar:
        def update(self, n: int) -> None: ...
        def set_postfix_str(self, s: str) -> None: ...
        def close(self) -> None: ...

    fed = list(_training_text([SourceFile(path, 0, path.stat().st_size)], 1 << 16, Bar()))
    assert max(len(t) for t in fed) <= 1 << 17  # the chunks of what is not a long run
    runs = [t for t in fed if set(t) <= {"q"} and t]
    assert sum(map(len, runs)) == min(300 << 10, LONG_RUNS) and max(map(len, runs)) == RUN_PIECE


def test_prepare_of_text_without_whitespace_encodes_all_of_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    letters = "".join(chr(97 + (i * 7919) % 26) for i in range(200_000))
    (src / "a.txt").write_text(letters)
    result = prepare([src], tmp_path / "d", vocab_size=300, split_block=64, progress=False)
    tok = Tokenizer.from_file(str(tmp_path / "d" / "tokenizer.json"))
    data = TokenData.open(tmp_path / "d")
    decoded = [tok.decode(s.tolist(), skip_special_tokens=True) for s in (data.train, data.val)]
    assert result.meta.tokens == len(data.train) + len(data.val)
    assert sum(map(len, decoded)) == len(letters)  # every character encoded, in blocks
