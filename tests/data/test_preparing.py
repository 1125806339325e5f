"""`lmcore.data.preparing` (`prepare`): the tokenizer it trains, the split rule, the files it writes, what
it refuses and how, and text without whitespace, read in bounded pieces."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from tokenizers import Tokenizer, models, pre_tokenizers

from lmcore.data import EOT, TokenData, dtype_for
from lmcore.data.meta import DataMeta
from lmcore.data.preparing import (
    LONG_RUNS,
    RUN_PIECE,
    _SplitWriter,
    _training_text,
    load_tokenizer,
    prepare,
    train_tokenizer,
)
from lmcore.data.sources import SourceFile, read_chunks
from lmcore.errors import DataError, LmcoreError
from tests.helpers.errors import raises_naming
from tests.helpers.runs import SAMPLE, prepare_small, unicode_text, write


@given(text=unicode_text())
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


def test_chunked_prepare_equals_one_pass_and_follows_the_split_rule(
    corpus: Path, tmp_path: Path
) -> None:
    one = prepare_small([corpus], tmp_path / "one", chunk_bytes=1 << 20, batch_bytes=1 << 30)
    many = prepare_small([corpus], tmp_path / "many", chunk_bytes=7, batch_bytes=13, split_block=64)
    # The tokenizer trained on 7-byte chunks is the one trained on whole files.
    assert (tmp_path / "one/tokenizer.json").read_bytes() == (
        tmp_path / "many/tokenizer.json"
    ).read_bytes()
    again = prepare_small([corpus], tmp_path / "again", chunk_bytes=1 << 20, split_block=64)
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
    meta = prepare_small([src], tmp_path / "out", split_block=16)
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


def test_uint16_until_the_vocabulary_needs_uint32(tmp_path: Path, corpus: Path) -> None:
    assert dtype_for(257) == dtype_for(2**16) == "uint16"
    assert dtype_for(2**16 + 1) == "uint32"
    # A reused tokenizer with more than 65,536 tokens: ids past 65,535 survive the round trip.
    big = train_tokenizer(iter([SAMPLE] * 5), 300)
    big.add_tokens([f"zq{i}q" for i in range(2**16)])
    big.save(str(tmp_path / "big.json"))
    write(corpus / "zz.txt", "a zq65535q b")  # last added token: id ≥ 65,536
    meta = prepare_small(
        [corpus], tmp_path / "out", vocab_size=None, tokenizer=tmp_path / "big.json"
    )
    assert meta.dtype == "uint32" and meta.vocab_size == big.get_vocab_size() > 2**16
    data = TokenData.open(tmp_path / "out")
    ids = np.concatenate([data.train, data.val])
    assert (tmp_path / "out/train.bin").stat().st_size == 4 * meta.splits["train"].tokens
    assert int(ids.max()) == big.token_to_id("zq65535q") >= 2**16
    assert "a zq65535q b" in data.decode(ids)
    uint16 = prepare_small([corpus], tmp_path / "u16")
    assert uint16.dtype == "uint16"
    assert (tmp_path / "u16/val.bin").stat().st_size == 2 * uint16.splits["val"].tokens


def test_files_and_metadata(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = prepare(
        [corpus], out, vocab_size=400, val_fraction=0.25, split_block=32, progress=False
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json",
        "tokenizer.json",
        "train.bin",
        "train.starts.bin",
        "val.bin",
        "val.starts.bin",
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
    with raises_naming(DataError, "meta.json", "lmcore-tokens version 2", "reads version 1",
                       "lmcore data prepare SOURCE... --out DIR --force"):  # fmt: skip
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
    first = prepare_small([corpus], tmp_path / "a")
    reused = prepare_small(
        [corpus], tmp_path / "b", vocab_size=None, tokenizer=tmp_path / "a/tokenizer.json"
    )
    assert (
        reused.tokenizer_from == str(tmp_path / "a/tokenizer.json") and first.tokenizer_from is None
    )
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert reused.splits == first.splits
    # Reusing the tokenizer of the directory being replaced works too: it is read first.
    again = prepare_small(
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
    meta = prepare_small(
        [corpus], tmp_path / "out", vocab_size=None, tokenizer=tmp_path / "gpt2ish.json"
    )
    assert meta.eot_id == tok.get_vocab_size() - 1 == meta.vocab_size - 1


def test_force_replaces_and_without_it_nothing_is_touched(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_small([corpus], out, val_fraction=0.1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with raises_naming(DataError, repr(str(out)), "already holds prepared data",
                       "(train.bin, val.bin, tokenizer.json, meta.json)", "nothing was written",
                       "--force", "another --out"):  # fmt: skip
        prepare_small([corpus], out, val_fraction=0.3)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # One data file is enough to refuse.
    lone = tmp_path / "lone"
    write(lone / "val.bin", b"\0\0")
    with pytest.raises(DataError, match=r"already holds prepared data \(val\.bin\)"):
        prepare_small([corpus], lone)
    meta = prepare_small([corpus], out, val_fraction=0.3, force=True)
    assert meta.val_fraction == 0.3
    assert (out / "val.bin").read_bytes() != before["val.bin"]
    assert TokenData.open(out).meta == meta


def test_a_failure_leaves_nothing_half_written(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    prepare_small([corpus], out)
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
        prepare_small([corpus], out, force=True, val_fraction=0.3)
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
            prepare_small([corpus], out, force=True, val_fraction=0.3)
        monkeypatch.undo()
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in tmp_path.glob(".out*")) == [".out.lock"]
    with pytest.raises(DataError, match="already holds prepared data"):
        prepare_small([corpus], out)


def test_empty_input_errors(tmp_path: Path) -> None:
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    with raises_naming(DataError, repr(str(empty)), "no non-hidden file",
                       "ending in .md, .py, .rst, .txt"):  # fmt: skip
        prepare_small([empty], out)
    other = tmp_path / "other"
    for name in ("a.csv", "b.csv", "c.json"):
        write(other / name, "1,2")
    with raises_naming(DataError, "2 .csv, 1 .json", "--ext .csv"):
        prepare_small([other], out)
    blank = tmp_path / "blank"
    write(blank / "a.txt", "")
    write(blank / "b.txt", "")
    with raises_naming(DataError, "no text", "2 file(s), all empty"):
        prepare_small([blank], out)
    write(tmp_path / "story.txt", "hi")
    with raises_naming(DataError, repr(str(tmp_path / "stroy.txt")), "does not exist",
                       "did you mean 'story.txt'?"):  # fmt: skip
        prepare_small([tmp_path / "stroy.txt"], out)
    with pytest.raises(DataError, match="no sources given"):
        prepare_small([], out)
    assert not out.exists()


def test_undecodable_bytes_name_the_file_and_offset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "a.txt", "fine text\n")
    # The bad byte sits after a multi-byte character split across 4-byte read blocks.
    bad = write(src / "b.txt", "héllo wörld ".encode() + b"caf\xe9 au lait\n")
    with raises_naming(DataError, f"{bad}: byte offset 17", "b'\\xe9'", "not valid UTF-8",
                       "invalid continuation byte", "iconv -f latin1 -t utf-8",
                       "--exclude b.txt", "--skip-undecodable"):  # fmt: skip
        prepare_small([src], tmp_path / "out", chunk_bytes=4)
    assert not (tmp_path / "out").exists()
    truncated = write(src / "c.txt", "ok €".encode()[:-1])  # ends inside a character
    with pytest.raises(DataError, match=re.escape(f"{truncated}: byte offset 3: b'\\xe2\\x82'")):
        list(read_chunks(truncated))
    # With a tokenizer reused there is no training pass: the encoding pass finds it.
    tokenizer = tmp_path / "tok.json"
    train_tokenizer(iter([SAMPLE]), 300).save(str(tokenizer))
    with pytest.raises(DataError, match=re.escape(f"{bad}: byte offset 17")):
        prepare_small([src], tmp_path / "out", vocab_size=None, tokenizer=tokenizer, split_block=4)
    assert not (tmp_path / "out").exists()


def test_skip_undecodable_lists_what_it_left_out(corpus: Path, tmp_path: Path) -> None:
    bad = write(corpus / "zz_latin1.txt", "caf\xe9\n".encode("latin-1"))
    meta = prepare_small([corpus], tmp_path / "out", skip_undecodable=True)
    assert meta.skipped == (f"{bad}: not UTF-8 at byte offset 3",)
    assert meta.files == 12  # the latin-1 file is not counted


def test_vocabulary_errors(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with raises_naming(DataError, "--vocab-size 256", "byte alphabet (256) plus <|endoftext|>",
                       "at least 257", "e.g. 10000"):  # fmt: skip
        prepare_small([corpus], out, vocab_size=256)
    with pytest.raises(DataError, match=r"--vocab-size 4294967297 does not fit uint32"):
        prepare_small([corpus], out, vocab_size=2**32 + 1)
    with raises_naming(DataError, "--vocab-size 500", "--tokenizer t.json", "drop --vocab-size"):
        prepare_small([corpus], out, vocab_size=500, tokenizer="t.json")
    assert prepare_small([corpus], out, vocab_size=257).vocab_size == 257  # bytes + <|endoftext|>


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, math.nan])
def test_val_fraction_out_of_range(corpus: Path, tmp_path: Path, fraction: float) -> None:
    with raises_naming(DataError, f"--val-fraction {fraction} is out of range",
                       "strictly between 0 and 1", "e.g. 0.1"):  # fmt: skip
        prepare_small([corpus], tmp_path / "out", val_fraction=fraction)


def test_a_split_too_small_for_a_window(tmp_path: Path) -> None:
    # With 257 tokens (bytes and <|endoftext|>) there are no merges: one token per byte.
    one = write(tmp_path / "one.txt", "a single short document, " * 20)  # 500 bytes
    out = tmp_path / "out"
    # One document shorter than a block: all of it goes to train, val stays empty.
    with raises_naming(DataError, "val.bin would hold 0 tokens", "context_length + 1 = 2",
                       "501 tokens in 1 documents", "nothing was written",
                       "raise --val-fraction (now 0.1)", "lower --split-block (now 8192)",
                       "add text") as e:  # fmt: skip
        prepare_small([one], out, vocab_size=257)
    assert "--context-length" not in str(e.value)  # prepare was given none to lower
    assert not out.exists()  # created by prepare, removed again
    meta = prepare_small([one], out, vocab_size=257, split_block=10)
    train, val = reference_split([*range(1, 501), 0], 0, 0.1, 10)
    assert (meta.splits["train"].tokens, meta.splits["val"].tokens) == (len(train), len(val))
    assert len(val) == 50 and len(train) == 451
    with raises_naming(DataError, "val.bin would hold 50 tokens", "context_length + 1 = 51",
                       "501 tokens in 1 documents", "raise --val-fraction (now 0.1)",
                       "lower --split-block (now 10)",
                       "lower --context-length (now 50)"):  # fmt: skip
        prepare_small([one], tmp_path / "b", vocab_size=257, split_block=10, context_length=50)
    with raises_naming(DataError, "train.bin would hold 51 tokens", "context_length + 1 = 52",
                       "101 tokens in 1 documents", "lower --val-fraction (now 0.5)",
                       "lower --context-length (now 51)") as e:  # fmt: skip
        prepare_small(
            [write(tmp_path / "short.txt", "x" * 100)], tmp_path / "c",
            vocab_size=257, split_block=1, val_fraction=0.5, context_length=51,
        )  # fmt: skip
    assert "--split-block" not in str(e.value)  # smaller blocks would not grow train.bin


def test_tokenizers_that_cannot_be_reused(corpus: Path, tmp_path: Path) -> None:
    def reuse(path: Path) -> None:
        prepare_small([corpus], tmp_path / "out", vocab_size=None, tokenizer=path)

    with raises_naming(DataError, f"--tokenizer {str(tmp_path / 'none.json')!r}", "does not exist"):
        reuse(tmp_path / "none.json")
    write(tmp_path / "junk.json", "{not json")
    with pytest.raises(DataError, match=r"is not a Hugging Face tokenizer\.json"):
        reuse(tmp_path / "junk.json")
    no_eot = train_tokenizer(iter([SAMPLE]), 300)
    config = json.loads(no_eot.to_str())
    config["added_tokens"] = []
    config["pre_tokenizer"] = {"type": "Whitespace"}
    write(tmp_path / "ws.json", json.dumps(config))
    with raises_naming(DataError, f"--tokenizer {str(tmp_path / 'ws.json')!r} cannot be reused",
                       "pre_tokenizer is Whitespace, not ByteLevel", f"no added token {EOT}",
                       "GPT-2-style byte-level BPE"):  # fmt: skip
        reuse(tmp_path / "ws.json")
    spanning = train_tokenizer(iter([SAMPLE]), 300)
    spanning.add_tokens(["a\nb"])
    spanning.save(str(tmp_path / "span.json"))
    with raises_naming(DataError, "1 added token(s)", "join text and whitespace",
                       "('a\\nb')"):  # fmt: skip
        load_tokenizer(tmp_path / "span.json")


def test_option_and_output_errors(corpus: Path, tmp_path: Path) -> None:
    file_out = write(tmp_path / "file", "x")
    with raises_naming(DataError, f"--out {str(file_out)!r}", "is a file, not a directory",
                       "another --out"):  # fmt: skip
        prepare_small([corpus], file_out)
    with pytest.raises(DataError, match=r"--split-block 0 must be at least 1 token"):
        prepare_small([corpus], tmp_path / "o", split_block=0)
    with pytest.raises(DataError, match=r"empty file extension '\.'"):
        prepare_small([corpus], tmp_path / "o", extensions=["."])
    assert issubclass(DataError, LmcoreError) and issubclass(DataError, ValueError)


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


# --- the document index --------------------------------------------------------------------


def _expected_starts(
    docs: list[list[int]], eot: int, fraction: float, block: int
) -> dict[str, list[int]]:
    """meta.SPLIT_RULE and STARTS_RULE token by token: each split's document starts."""
    count = {"train": 0, "val": 0}
    starts: dict[str, list[int]] = {"train": [], "val": []}
    previous, ended = None, True
    for doc in docs:
        i = 0
        while i < len(doc):
            seen = count["train"] + count["val"]
            split = "val" if count["val"] < fraction * seen else "train"
            if ended or split != previous:
                starts[split].append(count[split])
            taken = doc[i : i + block]
            if eot in taken:
                taken = taken[: taken.index(eot) + 1]
            count[split] += len(taken)
            i += len(taken)
            previous, ended = split, taken[-1] == eot
    return starts


@pytest.mark.parametrize("split_block", [8192, 16])
def test_the_document_index_marks_where_each_document_starts(
    tmp_path: Path, split_block: int
) -> None:
    root = tmp_path / "corpus"
    texts = [f"File {i}. " + SAMPLE * (1 + i % 4) for i in range(9)]
    texts[4] = f"two documents{EOT}in one file"  # the literal end-of-text splits a file
    for i, text in enumerate(texts):
        write(root / f"f{i}.txt", text)
    meta = prepare_small([root], tmp_path / "data", val_fraction=0.25, split_block=split_block,
                         chunk_bytes=11, batch_bytes=29)  # fmt: skip
    data = TokenData.open(tmp_path / "data")
    tok = data.tokenizer()
    eot = data.eot_id
    docs = [[*tok.encode(t, add_special_tokens=False).ids, eot] for t in texts]
    want = _expected_starts(docs, eot, 0.25, split_block)
    assert data.documents is not None
    for name in ("train", "val"):
        got = data.documents[name]
        assert got.dtype == np.dtype("<i8") and got.tolist() == want[name]
        info = meta.splits[name]
        assert info.starts == len(want[name]) and info.starts_file == f"{name}.starts.bin"
        assert (tmp_path / "data" / info.starts_file).stat().st_size == 8 * info.starts
    if split_block == 8192:  # whole documents: the offsets' steps are their token counts
        lengths = sorted(
            np.diff(np.append(data.documents[n], len(data.split(n)))).tolist()
            for n in ("train", "val")
        )
        flat = sorted(x for part in lengths for x in part)
        assert flat == sorted([*(len(d) for d in docs if eot not in d[:-1]),
                               *(len(p) + 1 for d in docs if eot in d[:-1]
                                 for p in _parts(d[:-1], eot))])  # fmt: skip
        assert data.meta.splits["train"].starts == data.meta.splits["train"].documents


def _parts(ids: list[int], eot: int) -> list[list[int]]:
    out: list[list[int]] = [[]]
    for i in ids:
        if i == eot:
            out.append([])
        else:
            out[-1].append(i)
    return out


def test_the_summary_names_the_index(corpus: Path, tmp_path: Path) -> None:
    from lmcore.data.preparing import summary_lines

    result = prepare([corpus], tmp_path / "data", vocab_size=400, progress=False)
    lines = summary_lines(result)
    assert "train.starts.bin, val.starts.bin" in lines[0]
    assert any(line.startswith("document starts: train ") for line in lines)
