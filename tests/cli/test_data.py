"""`lmcore data prepare`: the summary it prints, its options, and its errors (exit 2, one line);
a vocabulary larger than the text can fill is not reserved."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmcore.cli.main import main
from lmcore.data import TokenData
from tests.helpers.models import tiny_corpus

TEXT = "The quick brown fox jumps over the lazy dog. " * 30 + "\n"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(10):
        (root / f"{i}.txt").write_text(f"story {i}: " + TEXT * (1 + i % 2))
    (root / "notes.csv").write_text("a,b\n")
    return root


def prepare(*args: str | Path) -> int:
    return main(["data", "prepare", *map(str, args), "--vocab-size", "300"])


def test_summary(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert prepare(corpus, "--out", out, "--split-block", "64") == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    meta = TokenData.open(out).meta
    train, val = meta.splits["train"], meta.splits["val"]
    total = train.tokens + val.tokens
    assert lines[0] == (
        f"data: {out}: train.bin, val.bin (uint16), train.starts.bin, val.starts.bin, "
        "tokenizer.json, meta.json"
    )
    size = sum(p.stat().st_size for p in corpus.glob("*.txt"))
    assert lines[1] == f"text: 10 files, {size:,} bytes of UTF-8 from 1 source"
    assert re.fullmatch(
        r"tokenizer: byte-level BPE, 300 tokens \(<\|endoftext\|> = 0\), trained in \d+\.\d s",
        lines[2],
    )
    assert lines[3] == (
        f"tokens: train {train.tokens:,} ({100 * train.tokens / total:.1f}%, "
        f"{train.documents:,} documents), val {val.tokens:,} ({100 * val.tokens / total:.1f}%, "
        f"{val.documents:,} documents)"
    )
    assert lines[4] == (
        f"document starts: train {train.starts:,} (mean {train.tokens / train.starts:,.0f} "
        f"tokens), val {val.starts:,} (mean {val.tokens / val.starts:,.0f} tokens) (the index "
        "of *.starts.bin)"
    )
    assert re.fullmatch(
        rf"time: \d+\.\d s in all; encoding {total:,} tokens took \d+\.\d s, [\d,]+ tokens/s",
        lines[5],
    )
    assert len(lines) == 6
    assert captured.err == ""  # no progress bars when stderr is not a terminal


def test_options_reach_prepare(corpus: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert prepare(corpus, "--out", a, "--ext", "csv", "--ext", ".txt", "--exclude", "1.*") == 0
    meta = TokenData.open(a).meta
    assert meta.files == 10 and meta.extensions == (".csv", ".txt") and meta.exclude == ("1.*",)
    assert meta.sources[0].bytes == sum(p.stat().st_size for p in corpus.iterdir()) - len(
        (corpus / "1.txt").read_bytes()
    )
    assert main(["data", "prepare", str(corpus), "--out", str(b), "--val-fraction", "0.3",
                 "--tokenizer", str(a / "tokenizer.json"), "--split-block", "32"]) == 0  # fmt: skip
    meta = TokenData.open(b).meta
    assert meta.tokenizer_from == str(a / "tokenizer.json") and meta.val_fraction == 0.3
    assert meta.files == 10 and meta.split_block == 32
    raw = json.loads((b / "meta.json").read_text())
    assert raw["extensions"] == [".txt", ".md", ".rst", ".py"]  # the defaults


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--val-fraction", "1.5"],
            "--val-fraction 1.5 is out of range: it is the share of tokens for val.bin, "
            "strictly between 0 and 1 (e.g. 0.1)",
        ),
        (
            ["--vocab-size", "100"],
            "--vocab-size 100 is smaller than the byte alphabet (256) plus <|endoftext|>: use at "
            "least 257 (e.g. 10000)",
        ),
        (["--ext", ".json"], "holds no non-hidden file ending in .json; it holds 10 .txt, 1 .csv"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    code = main(["data", "prepare", str(corpus), "--out", str(tmp_path / "out"), *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("lmcore data prepare: error: ")
    assert message in captured.err and captured.err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_existing_data_needs_force(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert prepare(corpus, "--out", out) == 0
    before = (out / "train.bin").read_bytes()
    capsys.readouterr()
    assert prepare(corpus, "--out", out, "--val-fraction", "0.5") == 2
    assert capsys.readouterr().err == (
        f"lmcore data prepare: error: output directory {str(out)!r} already holds prepared data "
        "(train.bin, val.bin, tokenizer.json, meta.json); nothing was written: pass --force to "
        "replace it, or choose another --out\n"
    )
    assert (out / "train.bin").read_bytes() == before
    assert prepare(corpus, "--out", out, "--val-fraction", "0.5", "--force") == 0
    assert (out / "train.bin").read_bytes() != before


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["data"], ["data", "prepare", "x"], ["data", "prepare", "--out", "d"]):
        assert main(argv) == 2  # usage errors: one line, status 2 (issue 11)
    assert "the following arguments are required" in capsys.readouterr().err


def test_skip_undecodable_in_the_summary(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = corpus / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    assert prepare(corpus, "--out", tmp_path / "a") == 2
    assert f"{bad}: byte offset 3: b'\\xe9' is not valid UTF-8" in capsys.readouterr().err
    assert prepare(corpus, "--out", tmp_path / "b", "--skip-undecodable") == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith(
        "from 1 source; skipped 1 not UTF-8 (meta.json lists them), e.g. "
        f"{bad}: not UTF-8 at byte offset 3"
    )


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


# --- --chat ----------------------------------------------------------------------------------


def test_chat_data_from_a_checkpoint_and_a_run_trained_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("jinja2", reason="needs the 'chat' extra")
    from tests.helpers.chat import chat_checkpoint, conversations, write_chats

    ckpt = chat_checkpoint(tmp_path)
    chats = write_chats(tmp_path / "c.jsonl", conversations(36))
    out = tmp_path / "data"
    assert main(["data", "prepare", "--chat", str(chats), "--tokenizer-from", str(ckpt),
                 "--out", str(out), "--val-fraction", "0.25", "--context-length", "32"]) == 0
    printed = capsys.readouterr().out
    assert "with loss masks and document starts" in printed and "trained)" in printed
    assert (out / "train.mask.bin").is_file() and (out / "val.docs.bin").is_file()
    run = tmp_path / "run"
    assert main(["train", str(ckpt), "--data", str(out), "--out", str(run), "--steps", "2",
                 "--batch-size", "2", "--eval-batches", "1", "--device", "cpu"]) == 0
    capsys.readouterr()
    # a run directory is a checkpoint to fine-tune from too
    assert main(["train", str(run), "--data", str(out), "--out", str(tmp_path / "again"),
                 "--steps", "1", "--batch-size", "2", "--eval-batches", "1",
                 "--device", "cpu"]) == 0  # fmt: skip
    assert "weights from" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--chat", "{chats}"], "--chat needs --tokenizer-from CKPT"),
        (["--tokenizer-from", "{ckpt}"], "--tokenizer-from needs --chat FILE.jsonl"),
        (["--chat", "{chats}", "--tokenizer-from", "{ckpt}", "--vocab-size", "300"],
         "--vocab-size: not with --chat"),
        (["--chat", "{tmp}/missing.jsonl", "--tokenizer-from", "{ckpt}"], "does not exist"),
        (["--chat", "{chats}", "--tokenizer-from", "{tmp}/nothing.safetensors"], "--tokenizer-from"),
        (["--chat", "{bad}", "--tokenizer-from", "{ckpt}"], "line 2 is not JSON"),
        (["--chat", "{chats}", "--tokenizer-from", "{plain}"], "stores no tokenizer"),
    ],
)
def test_chat_errors_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    pytest.importorskip("jinja2", reason="needs the 'chat' extra")
    import lmcore
    from tests.helpers.chat import CHAT_SPEC, chat_checkpoint, write_chats

    ckpt = chat_checkpoint(tmp_path)
    chats = write_chats(tmp_path / "c.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(chats.read_text().splitlines()[0] + "\n{oops\n")
    plain = lmcore.build_model(CHAT_SPEC).save(tmp_path / "plain.safetensors")
    names = {"chats": chats, "ckpt": ckpt, "tmp": tmp_path, "bad": bad, "plain": plain}
    argv = [a.format(**names) for a in args]
    code = main(["data", "prepare", *argv, "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("lmcore data prepare: error: ")
    assert message in captured.err and captured.err.count("\n") == 1, captured.err
    assert not (tmp_path / "out").exists()
