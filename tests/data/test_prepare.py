"""Token data: the tokenizer, chunked encoding, the split rule, the files prepare writes, their
reader and the batch samplers, and every error of `prepare`."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from lmcore.data import EOT, TokenData, dtype_for, get_batch, prepare, step_seed
from lmcore.data.meta import DataMeta
from lmcore.data.prepare import _SplitWriter, load_tokenizer, train_tokenizer
from lmcore.data.sources import find_files, read_chunks, safe_cut
from lmcore.data.tokens import BatchSampler, EvalBatches
from lmcore.errors import DataError, LmcoreError

# Text for the small tokenizers below: words, code, whitespace runs and non-Latin scripts.
SAMPLE = (
    "Once upon a time there was a little robot. It liked to count: 1, 22, 333.\n\n"
    "def f(x):\n    return x * 2  # double\r\n\tindent\n"
    "Ünïcödé, 日本語のテキスト, Ελληνικά, emoji 🙂🚀 and  double  spaces.\n"
)
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(iter([SAMPLE] * 20), 400)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A directory of documents long enough for both splits at the default block size."""
    root = tmp_path / "corpus"
    for i in range(12):
        write(root / f"doc{i:02}.txt", f"Document {i}.\n" + SAMPLE * (1 + i % 3))
    return root


def small(sources: list[Path], out: Path, **kwargs: object) -> DataMeta:
    """`prepare` with a small vocabulary and no progress bars."""
    kwargs.setdefault("vocab_size", 400)
    return prepare(sources, out, progress=False, **kwargs).meta  # type: ignore[arg-type]


# --- the tokenizer and chunked encoding ----------------------------------------------------


@given(text=TEXT)
@settings(max_examples=200, deadline=None)
def test_round_trip_arbitrary_unicode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_round_trip_keeps_end_of_text_and_learns_no_merge_across_it(tok: Tokenizer) -> None:
    text = f"a story.{EOT}Another one{EOT}"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids.count(tok.token_to_id(EOT)) == 2
    assert tok.decode(ids, skip_special_tokens=False) == text
    # The trainer saw the text split at <|endoftext|>, so no piece of it became a merge.
    trained = train_tokenizer(iter([f"abc{EOT}" * 50]), 300)
    assert not [t for t in trained.get_vocab() if t != EOT and ("endof" in t or "|>" in t)]
    assert trained.token_to_id(EOT) == 0


@given(text=TEXT, chunk=st.integers(1, 40))
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


def test_chunked_prepare_equals_one_pass_and_follows_the_split_rule(
    corpus: Path, tmp_path: Path
) -> None:
    one = small([corpus], tmp_path / "one", chunk_bytes=1 << 20, batch_bytes=1 << 30)
    many = small([corpus], tmp_path / "many", chunk_bytes=7, batch_bytes=13, split_block=64)
    # The tokenizer trained on 7-byte chunks is the one trained on whole files.
    assert (tmp_path / "one/tokenizer.json").read_bytes() == (
        tmp_path / "many/tokenizer.json"
    ).read_bytes()
    again = small([corpus], tmp_path / "again", chunk_bytes=1 << 20, split_block=64)
    assert again.splits == many.splits
    for split in ("train", "val"):
        assert (tmp_path / f"many/{split}.bin").read_bytes() == (
            tmp_path / f"again/{split}.bin"
        ).read_bytes()
    # Independently: encode each file whole, append <|endoftext|>, split token by token.
    tok = Tokenizer.from_file(str(tmp_path / "one/tokenizer.json"))
    eot = tok.token_to_id(EOT)
    stream: list[int] = []
    for path in sorted(corpus.iterdir()):
        text = path.read_bytes().decode()  # read_text() would translate the \r\n
        stream += [*tok.encode(text, add_special_tokens=False).ids, eot]
    for meta, block, name in ((one, 8192, "one"), (many, 64, "many")):
        train, val = reference_split(stream, eot, 0.1, block)
        data = TokenData.open(tmp_path / name)
        assert data.train.tolist() == train and data.val.tolist() == val
        assert meta.splits["train"].documents + meta.splits["val"].documents == 12
    # The rule keeps val within one block of its share.
    assert abs(many.splits["val"].tokens - 0.1 * len(stream)) <= 64


def reference_split(
    stream: list[int], eot: int, fraction: float, block: int
) -> tuple[list[int], list[int]]:
    """The split rule, one token at a time."""
    train: list[int] = []
    val: list[int] = []
    current: list[int] | None = None
    left = 0
    for t in stream:
        if current is None:
            current = val if len(val) < fraction * (len(train) + len(val)) else train
            left = block
        current.append(t)
        left -= 1
        if t == eot or left == 0:
            current = None
    return train, val


def test_documents_end_with_end_of_text_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "a.txt", f"first story.{EOT}second story.{EOT}")  # ends with it: no second one
    write(src / "b.txt", "third story.")  # gets one
    write(src / "c.txt", "")  # empty: contributes nothing
    write(src / "d.txt", ("long text here. " * 40).strip())
    meta = small([src], tmp_path / "out", split_block=16)
    data = TokenData.open(tmp_path / "out")
    assert meta.splits["train"].documents + meta.splits["val"].documents == 4
    tok = data.tokenizer()

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    eot = data.eot_id
    whole = [
        *ids(f"first story.{EOT}second story.{EOT}"),  # a.txt: its own two, no third
        *ids("third story."), eot,  # b.txt
        *ids(("long text here. " * 40).strip()), eot,  # d.txt; c.txt gave nothing
    ]  # fmt: skip
    train, val = reference_split(whole, eot, 0.1, 16)
    assert data.train.tolist() == train and data.val.tolist() == val


# --- dtype ---------------------------------------------------------------------------------


def test_uint16_until_the_vocabulary_needs_uint32(tmp_path: Path, corpus: Path) -> None:
    assert dtype_for(257) == dtype_for(2**16) == "uint16"
    assert dtype_for(2**16 + 1) == "uint32"
    # A reused tokenizer with more than 65,536 tokens: ids past 65,535 survive the round trip.
    big = train_tokenizer(iter([SAMPLE] * 5), 300)
    big.add_tokens([f"zq{i}q" for i in range(2**16)])
    big.save(str(tmp_path / "big.json"))
    write(corpus / "zz.txt", "a zq65535q b")  # last added token: id ≥ 65,536
    meta = small([corpus], tmp_path / "out", vocab_size=None, tokenizer=tmp_path / "big.json")
    assert meta.dtype == "uint32" and meta.vocab_size == big.get_vocab_size() > 2**16
    data = TokenData.open(tmp_path / "out")
    ids = np.concatenate([data.train, data.val])
    assert (tmp_path / "out/train.bin").stat().st_size == 4 * meta.splits["train"].tokens
    assert int(ids.max()) == big.token_to_id("zq65535q") >= 2**16
    assert "a zq65535q b" in data.decode(ids)
    uint16 = small([corpus], tmp_path / "u16")
    assert uint16.dtype == "uint16"
    assert (tmp_path / "u16/val.bin").stat().st_size == 2 * uint16.splits["val"].tokens


# --- what prepare writes -------------------------------------------------------------------


def test_files_and_metadata(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = prepare(
        [corpus], out, vocab_size=400, val_fraction=0.25, split_block=32, progress=False
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "train.bin",
        "val.bin",
    ]
    raw = json.loads((out / "meta.json").read_text())
    assert raw["format"] == "lmcore-tokens" and raw["version"] == 1
    assert raw["vocab_size"] == 400 and raw["dtype"] == "uint16" and raw["eot_id"] == 0
    assert raw["eot_token"] == EOT and raw["val_fraction"] == 0.25
    assert raw["sources"] == [
        {"path": str(corpus), "files": 12, "bytes": sum(p.stat().st_size for p in corpus.iterdir())}
    ]
    assert EOT in raw["split_rule"] and EOT in raw["document_rule"]
    assert DataMeta.read(out / "meta.json") == result.meta
    (out / "meta.json").write_text(json.dumps({**raw, "version": 2}))
    with pytest.raises(
        DataError,
        match=r"meta.json has lmcore-tokens version 2; this lmcore reads version 1; prepare the "
        r"directory again: lmcore data prepare SOURCE\.\.\. --out DIR --force$",
    ):
        DataMeta.read(out / "meta.json")
    (out / "meta.json").write_text(json.dumps(raw))
    # numpy.memmap reads the files as the README says.
    train = np.memmap(out / "train.bin", dtype=np.uint16, mode="r")
    assert len(train) == raw["splits"]["train"]["tokens"] and train.max() < 400
    val = raw["splits"]["val"]["tokens"]
    assert abs(val - 0.25 * (len(train) + val)) <= 32  # within a block of the share
    assert result.tokens_per_second > 0 and result.tokenizer_seconds > 0
    assert not list(tmp_path.rglob(".*.tmp"))


def test_progress_bars_go_to_stderr(
    corpus: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    prepare([corpus], tmp_path / "out", vocab_size=300, progress=True)
    out, err = capfd.readouterr()
    assert out == ""
    size = f"{sum(p.stat().st_size for p in corpus.iterdir()) / 1024:.2f}k"  # tqdm's format
    assert re.search(rf"tokenizer: 100%.*{size}/{size}.*read; computing merges", err)
    tokens = TokenData.open(tmp_path / "out").meta.tokens
    assert re.search(rf"encode: 100%.*{size}/{size}.*{tokens:,} tokens", err)


def test_reuse_an_existing_tokenizer(corpus: Path, tmp_path: Path) -> None:
    first = small([corpus], tmp_path / "a")
    reused = small(
        [corpus], tmp_path / "b", vocab_size=None, tokenizer=tmp_path / "a/tokenizer.json"
    )
    assert (
        reused.tokenizer_from == str(tmp_path / "a/tokenizer.json") and first.tokenizer_from is None
    )
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert reused.splits == first.splits
    # Reusing the tokenizer of the directory being replaced works too: it is read first.
    again = small(
        [corpus],
        tmp_path / "a",
        vocab_size=None,
        tokenizer=tmp_path / "a/tokenizer.json",
        force=True,
    )
    assert again.splits == first.splits


def test_a_gpt2_style_tokenizer_can_be_reused(corpus: Path, tmp_path: Path) -> None:
    # GPT-2's tokenizer.json has this shape: byte-level BPE, <|endoftext|> as the last id.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import trainers

    tok.train_from_iterator(
        [SAMPLE],
        trainers.BpeTrainer(
            vocab_size=300,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tok.add_special_tokens([EOT])
    tok.save(str(tmp_path / "gpt2ish.json"))
    meta = small([corpus], tmp_path / "out", vocab_size=None, tokenizer=tmp_path / "gpt2ish.json")
    assert meta.eot_id == tok.get_vocab_size() - 1 == meta.vocab_size - 1


def test_force_replaces_and_without_it_nothing_is_touched(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    small([corpus], out, val_fraction=0.1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(DataError, match=re.escape(
        f"output directory {str(out)!r} already holds prepared data (train.bin, val.bin, "
        "tokenizer.json, meta.json); nothing was written: pass --force to replace it, or "
        "choose another --out"
    )):  # fmt: skip
        small([corpus], out, val_fraction=0.3)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # One data file is enough to refuse.
    lone = tmp_path / "lone"
    write(lone / "val.bin", b"\0\0")
    with pytest.raises(DataError, match=r"already holds prepared data \(val\.bin\)"):
        small([corpus], lone)
    meta = small([corpus], out, val_fraction=0.3, force=True)
    assert meta.val_fraction == 0.3
    assert (out / "val.bin").read_bytes() != before["val.bin"]
    assert TokenData.open(out).meta == meta


def test_a_failure_leaves_nothing_half_written(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    small([corpus], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = 0
    real_write = _SplitWriter.write

    def failing_write(self: _SplitWriter, ids: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise KeyboardInterrupt  # Ctrl-C in the middle of encoding
        real_write(self, ids)

    monkeypatch.setattr(_SplitWriter, "write", failing_write)
    with pytest.raises(KeyboardInterrupt):
        small([corpus], out, force=True, val_fraction=0.3)
    monkeypatch.undo()
    # The old data is intact and no temporary file is left behind.
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    TokenData.open(out)

    # A failure at any rename, of a file in the new directory or of the directory itself (the
    # commit): the old data stays whole, and nothing is left beside it.
    real_replace = os.replace
    for last in ("train.bin", "meta.json", out.name):
        failed: list[str] = []

        def crash_at(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
            if Path(dst).name == last and not failed:  # noqa: B023 (within this iteration)
                failed.append(last)  # noqa: B023
                raise OSError("disk full")
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", crash_at)
        with pytest.raises(OSError, match="disk full"):
            small([corpus], out, force=True, val_fraction=0.3)
        monkeypatch.undo()
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in tmp_path.glob(".out*")) == [".out.lock"]
    with pytest.raises(DataError, match="already holds prepared data"):
        small([corpus], out)


# --- which files are read ------------------------------------------------------------------


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


# --- errors of prepare ---------------------------------------------------------------------


def test_empty_input_errors(tmp_path: Path) -> None:
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=re.escape(
        f"directory {str(empty)!r} holds no non-hidden file ending in .md, .py, .rst, .txt"
    )):  # fmt: skip
        small([empty], out)
    other = tmp_path / "other"
    for name in ("a.csv", "b.csv", "c.json"):
        write(other / name, "1,2")
    with pytest.raises(DataError, match=re.escape(
        "it holds 2 .csv, 1 .json files: choose extensions with --ext, e.g. --ext .csv"
    )):  # fmt: skip
        small([other], out)
    blank = tmp_path / "blank"
    write(blank / "a.txt", "")
    write(blank / "b.txt", "")
    with pytest.raises(DataError, match=re.escape(
        "the sources hold no text: 2 file(s), all empty; give files with text in them"
    )):  # fmt: skip
        small([blank], out)
    write(tmp_path / "story.txt", "hi")
    with pytest.raises(DataError, match=re.escape(
        f"source {str(tmp_path / 'stroy.txt')!r} does not exist (did you mean 'story.txt'?); "
        "give text files or directories that hold them"
    )):  # fmt: skip
        small([tmp_path / "stroy.txt"], out)
    with pytest.raises(DataError, match="no sources given"):
        small([], out)
    assert not out.exists()


def test_undecodable_bytes_name_the_file_and_offset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "a.txt", "fine text\n")
    # The bad byte sits after a multi-byte character split across 4-byte read blocks.
    bad = write(src / "b.txt", "héllo wörld ".encode() + b"caf\xe9 au lait\n")
    with pytest.raises(DataError, match=re.escape(
        f"{bad}: byte offset 17: b'\\xe9' is not valid UTF-8 (invalid continuation byte); "
        "lmcore reads text as UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8), exclude "
        "it (--exclude b.txt) or skip every such file (--skip-undecodable)"
    )):  # fmt: skip
        small([src], tmp_path / "out", chunk_bytes=4)
    assert not (tmp_path / "out").exists()
    truncated = write(src / "c.txt", "ok €".encode()[:-1])  # ends inside a character
    with pytest.raises(DataError, match=re.escape(f"{truncated}: byte offset 3: b'\\xe2\\x82'")):
        list(read_chunks(truncated))
    # With a tokenizer reused there is no training pass: the encoding pass finds it.
    tokenizer = tmp_path / "tok.json"
    train_tokenizer(iter([SAMPLE]), 300).save(str(tokenizer))
    with pytest.raises(DataError, match=re.escape(f"{bad}: byte offset 17")):
        small([src], tmp_path / "out", vocab_size=None, tokenizer=tokenizer, split_block=4)
    assert not (tmp_path / "out").exists()


def test_skip_undecodable_lists_what_it_left_out(corpus: Path, tmp_path: Path) -> None:
    bad = write(corpus / "zz_latin1.txt", "caf\xe9\n".encode("latin-1"))
    meta = small([corpus], tmp_path / "out", skip_undecodable=True)
    assert meta.skipped == (f"{bad}: not UTF-8 at byte offset 3",)
    assert meta.files == 12  # the latin-1 file is not counted


def test_vocabulary_errors(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(DataError, match=re.escape(
        "--vocab-size 256 is smaller than the byte alphabet (256) plus <|endoftext|>: use at "
        "least 257 (e.g. 10000)"
    )):  # fmt: skip
        small([corpus], out, vocab_size=256)
    with pytest.raises(DataError, match=r"--vocab-size 4294967297 does not fit uint32"):
        small([corpus], out, vocab_size=2**32 + 1)
    with pytest.raises(DataError, match=re.escape(
        "--vocab-size 500 and --tokenizer t.json both given; a reused tokenizer brings its own "
        "vocabulary: drop --vocab-size"
    )):  # fmt: skip
        small([corpus], out, vocab_size=500, tokenizer="t.json")
    assert small([corpus], out, vocab_size=257).vocab_size == 257  # bytes + <|endoftext|>


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, math.nan])
def test_val_fraction_out_of_range(corpus: Path, tmp_path: Path, fraction: float) -> None:
    with pytest.raises(DataError, match=re.escape(
        f"--val-fraction {fraction} is out of range: it is the share of tokens for val.bin, "
        "strictly between 0 and 1 (e.g. 0.1)"
    )):  # fmt: skip
        small([corpus], tmp_path / "out", val_fraction=fraction)


def test_a_split_too_small_for_a_window(tmp_path: Path) -> None:
    # With 257 tokens (bytes and <|endoftext|>) there are no merges: one token per byte.
    one = write(tmp_path / "one.txt", "a single short document, " * 20)  # 500 bytes
    out = tmp_path / "out"
    # One document shorter than a block: all of it goes to train, val stays empty.
    with pytest.raises(DataError, match=re.escape(
        "val.bin would hold 0 tokens, fewer than one window of context_length + 1 = 2 (the "
        "text has 501 tokens in 1 documents); nothing was written: raise --val-fraction (now "
        "0.1) or lower --split-block (now 8192) so that a long document makes more blocks, or "
        "add text"
    )):  # fmt: skip
        small([one], out, vocab_size=257)
    assert not out.exists()  # created by prepare, removed again
    meta = small([one], out, vocab_size=257, split_block=10)
    train, val = reference_split([*range(1, 501), 0], 0, 0.1, 10)
    assert (meta.splits["train"].tokens, meta.splits["val"].tokens) == (len(train), len(val))
    assert len(val) == 50 and len(train) == 451
    with pytest.raises(DataError, match=re.escape(
        "val.bin would hold 50 tokens, fewer than one window of context_length + 1 = 51 (the "
        "text has 501 tokens in 1 documents); nothing was written: raise --val-fraction (now "
        "0.1) or lower --split-block (now 10) so that a long document makes more blocks, or add "
        "text, or lower --context-length (now 50)"
    )):  # fmt: skip
        small([one], tmp_path / "b", vocab_size=257, split_block=10, context_length=50)
    with pytest.raises(DataError, match=re.escape(
        "train.bin would hold 51 tokens, fewer than one window of context_length + 1 = 52 (the "
        "text has 101 tokens in 1 documents); nothing was written: lower --val-fraction (now "
        "0.5), or add text, or lower --context-length (now 51)"
    )):  # fmt: skip
        small(
            [write(tmp_path / "short.txt", "x" * 100)], tmp_path / "c",
            vocab_size=257, split_block=1, val_fraction=0.5, context_length=51,
        )  # fmt: skip


def test_tokenizers_that_cannot_be_reused(corpus: Path, tmp_path: Path) -> None:
    def reuse(path: Path) -> None:
        small([corpus], tmp_path / "out", vocab_size=None, tokenizer=path)

    with pytest.raises(DataError, match=re.escape(
        f"--tokenizer {str(tmp_path / 'none.json')!r} does not exist"
    )):  # fmt: skip
        reuse(tmp_path / "none.json")
    write(tmp_path / "junk.json", "{not json")
    with pytest.raises(DataError, match=r"is not a Hugging Face tokenizer\.json"):
        reuse(tmp_path / "junk.json")
    no_eot = train_tokenizer(iter([SAMPLE]), 300)
    config = json.loads(no_eot.to_str())
    config["added_tokens"] = []
    config["pre_tokenizer"] = {"type": "Whitespace"}
    write(tmp_path / "ws.json", json.dumps(config))
    with pytest.raises(DataError, match=re.escape(
        f"--tokenizer {str(tmp_path / 'ws.json')!r} cannot be reused: its pre_tokenizer is "
        f"Whitespace, not ByteLevel; it has no added token {EOT}. lmcore reuses GPT-2-style "
        "byte-level BPE tokenizers"
    )):  # fmt: skip
        reuse(tmp_path / "ws.json")
    spanning = train_tokenizer(iter([SAMPLE]), 300)
    spanning.add_tokens(["a\nb"])
    spanning.save(str(tmp_path / "span.json"))
    with pytest.raises(DataError, match=re.escape(
        "1 added token(s) join text and whitespace or strip whitespace ('a\\nb')"
    )):  # fmt: skip
        load_tokenizer(tmp_path / "span.json")


def test_option_and_output_errors(corpus: Path, tmp_path: Path) -> None:
    file_out = write(tmp_path / "file", "x")
    with pytest.raises(DataError, match=re.escape(
        f"--out {str(file_out)!r} is a file, not a directory; choose another --out"
    )):  # fmt: skip
        small([corpus], file_out)
    with pytest.raises(DataError, match=r"--split-block 0 must be at least 1 token"):
        small([corpus], tmp_path / "o", split_block=0)
    with pytest.raises(DataError, match=r"empty file extension '\.'"):
        small([corpus], tmp_path / "o", extensions=["."])
    assert issubclass(DataError, LmcoreError) and issubclass(DataError, ValueError)


# --- reading prepared data -----------------------------------------------------------------


def test_open_checks_the_files_against_the_metadata(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    meta = small([corpus], out)
    data = TokenData.open(out)
    assert (
        data.vocab_size == 400 and data.eot_id == 0 and len(data.val) == meta.splits["val"].tokens
    )
    assert repr(data).startswith(f"TokenData({str(out)!r}: train ")
    assert isinstance(data.train, np.memmap) and not data.train.flags.writeable
    with pytest.raises(DataError, match=re.escape("no split 'valid' (did you mean 'val'?)")):
        data.split("valid")
    with pytest.raises(DataError, match=re.escape(
        f"data directory {str(tmp_path / 'nope')!r} does not exist"
    )):  # fmt: skip
        TokenData.open(tmp_path / "nope")
    with open(out / "train.bin", "ab") as f:
        f.write(b"\0")  # one byte too many
    train = meta.splits["train"].tokens
    with pytest.raises(DataError, match=re.escape(
        f"{out / 'train.bin'} holds {2 * train + 1:,} bytes, but meta.json says {train:,} tokens "
        f"× 2 bytes = {2 * train:,}: the files do not belong together"
    )):  # fmt: skip
        TokenData.open(out)
    raw = json.loads((out / "meta.json").read_text())
    raw["vocab_size"] = "many"
    (out / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(DataError, match=re.escape(
        f"{out / 'meta.json'}: vocab_size should be an integer, found 'many'"
    )):  # fmt: skip
        TokenData.open(out)


def test_check_context_and_vocabulary(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    meta = small([corpus], out)
    data = TokenData.open(out)
    val = meta.splits["val"].tokens
    data.check(context_length=val - 1, vocab_size=400)
    with pytest.raises(DataError, match=re.escape(
        f"val.bin of {out} holds {val:,} tokens, fewer than one window of context_length + 1 = "
        f"{val + 1:,}; use a shorter context_length"
    )):  # fmt: skip
        data.check(context_length=val)
    with pytest.raises(DataError, match=re.escape(
        "the model's vocab_size=300 is smaller than the data's 400 tokens"
    )):  # fmt: skip
        data.check(context_length=8, vocab_size=300)


# --- batches -------------------------------------------------------------------------------


def counting(n: int) -> np.ndarray:
    """Ids equal to their position (mod 2**16), so a window shows where it came from."""
    return (np.arange(n) % 2**16).astype(np.uint16)


def test_get_batch_shapes_bounds_and_shift() -> None:
    data = counting(100)
    g = torch.Generator().manual_seed(0)
    starts: set[int] = set()
    for _ in range(300):
        x, y = get_batch(data, 8, 10, "cpu", generator=g)
        assert x.shape == y.shape == (8, 10) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y, x + 1)  # targets are the inputs shifted by one
        assert torch.equal(x, x[:, :1] + torch.arange(10))  # contiguous windows
        assert int(x[:, 0].min()) >= 0 and int(y[:, -1].max()) <= 99  # inside the data
        starts.update(x[:, 0].tolist())
    assert starts == set(range(90))  # every start that fits, and only those
    x, y = get_batch(counting(11), 4, 10)  # exactly one window fits
    assert x[:, 0].tolist() == [0] * 4
    with pytest.raises(DataError, match=re.escape(
        "the token array holds 10 tokens, fewer than one window of context_length + 1 = 11"
    )):  # fmt: skip
        get_batch(counting(10), 4, 10)


def test_get_batch_is_deterministic_per_seed() -> None:
    data = counting(10_000)

    def draw(seed: int) -> torch.Tensor:
        return get_batch(data, 16, 32, generator=torch.Generator().manual_seed(seed))[0]

    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))
    torch.manual_seed(5)
    a = get_batch(data, 4, 8)[0]
    torch.manual_seed(5)
    assert torch.equal(a, get_batch(data, 4, 8)[0])  # no generator: torch's global one


def test_sampler_batches_are_pure_functions_of_seed_and_step() -> None:
    data = counting(5_000)
    s = BatchSampler(data, batch_size=8, context_length=16, seed=3)
    x3, _ = s.batch(3)
    fresh = BatchSampler(data, batch_size=8, context_length=16, seed=3)
    assert torch.equal(fresh.batch(3)[0], x3)  # no state: resuming needs only the step
    it = s.iterate(start=3)
    assert torch.equal(next(it)[0], x3) and torch.equal(next(it)[0], s.batch(4)[0])
    assert not torch.equal(s.batch(4)[0], x3)
    other = BatchSampler(data, batch_size=8, context_length=16, seed=4)
    assert not torch.equal(other.batch(3)[0], x3)
    # Batch `step` is CS336's get_batch with the generator seeded by step_seed(seed, step).
    g = torch.Generator().manual_seed(step_seed(3, 3))
    assert torch.equal(get_batch(data, 8, 16, generator=g)[0], x3)
    assert step_seed(0, 1) != step_seed(1, 0) and 0 <= step_seed(2**40, 2**40) < 2**63


def test_rank_streams_are_disjoint_slices_of_the_global_batch() -> None:
    data = counting(5_000)
    whole = BatchSampler(data, batch_size=8, context_length=16, seed=7)
    ranks = [
        BatchSampler(data, batch_size=8, context_length=16, seed=7, rank=r, world_size=4)
        for r in range(4)
    ]
    for step in (0, 1, 99):
        parts = [r.batch(step) for r in ranks]
        assert all(p[0].shape == (2, 16) for p in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), whole.batch(step)[0])
        assert torch.equal(torch.cat([p[1] for p in parts]), whole.batch(step)[1])
    with pytest.raises(DataError, match=re.escape(
        "batch_size 6 (the global batch) is not divisible by world_size 4; use a multiple of "
        "4, e.g. 8"
    )):  # fmt: skip
        BatchSampler(data, batch_size=6, context_length=16, world_size=4)
    with pytest.raises(DataError, match=re.escape("rank 4 is not in 0..world_size-1")):
        BatchSampler(data, batch_size=8, context_length=16, rank=4, world_size=4)
    with pytest.raises(DataError, match=re.escape("seed and step must be ≥ 0, got seed=-1")):
        BatchSampler(data, batch_size=8, context_length=16, seed=-1)


def test_eval_batches_are_fixed_and_cover_the_split() -> None:
    data = counting(1_000)
    ev = EvalBatches(data, batch_size=4, context_length=10)
    # By default: as many non-overlapping windows as fit (99), in whole batches of 4.
    assert len(ev) == 24 and ev.predicted_tokens == 96 * 10
    starts = np.concatenate([ev.starts(i) for i in range(len(ev))])
    assert starts[0] == 0 and starts[-1] == 1_000 - 11  # first token to the last window
    assert np.diff(starts).min() >= 10  # no window overlaps the next
    first = [x.clone() for x, _ in ev]
    assert all(torch.equal(a, x) for a, (x, _) in zip(first, ev, strict=True))  # same each time
    for x, y in ev:
        assert torch.equal(y, x + 1) and int(y.max()) <= 999
    few = EvalBatches(data, batch_size=4, context_length=10, num_batches=2)
    assert len(few) == 2 and few.starts(1)[-1] == 989
    halves = [
        EvalBatches(data, batch_size=4, context_length=10, rank=r, world_size=2) for r in (0, 1)
    ]
    assert torch.equal(torch.cat([h[3][0] for h in halves]), ev[3][0])
    with pytest.raises(IndexError):
        ev.starts(len(ev))
    tiny = EvalBatches(counting(12), batch_size=4, context_length=10)
    assert len(tiny) == 1  # windows overlap when fewer than a batch fit side by side


def test_token_data_samplers(corpus: Path, tmp_path: Path) -> None:
    small([corpus], tmp_path / "out")
    data = TokenData.open(tmp_path / "out")
    x, y = data.sampler("val", batch_size=4, context_length=8, seed=1).batch(0)
    assert x.shape == (4, 8) and torch.equal(x[:, 1:], y[:, :-1])
    val = torch.from_numpy(data.val.astype(np.int64))
    for row in x:  # each row is a window of val.bin
        assert any(torch.equal(val[s : s + 8], row) for s in range(len(val) - 8))
    batches = data.val_batches(batch_size=2, context_length=8, num_batches=3)
    assert len(batches) == 3
    with pytest.raises(DataError, match=re.escape(f"val.bin of {tmp_path / 'out'} holds")):
        data.sampler("val", batch_size=1, context_length=len(data.val))
    assert isinstance(data.decode(x[0]), str)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_on_cuda() -> None:
    x, y = BatchSampler(counting(1_000), batch_size=4, context_length=8, device="cuda").batch(0)
    assert x.device.type == y.device.type == "cuda" and torch.equal(y.cpu(), x.cpu() + 1)
