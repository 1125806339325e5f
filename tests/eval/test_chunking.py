"""Text read and tokenised in bounded chunks: the ids of the pieces are those of the whole text
tokenised at once (UTF-8 sequences split by a block, CRLF split by a block, runs of spaces and
newlines, digits), for GPT-2's pre-tokenizer and Llama 3's; a tokenizer that merges across every
cut is refused by name; a byte that is not UTF-8 is named with its offset."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from lmcore.errors import EvalError
from lmcore.eval.chunking import CUT_CHECK, text_chunks, utf8_size
from tests.helpers.errors import raises_naming
from tests.helpers.runs import SAMPLE, byte_level_bpe

# Llama 3's pre-tokenizer expression (as GGUF's "llama-bpe" names it)
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def hostile_text(size: int, seed: int = 0) -> str:
    """About `size` characters: words, numbers, punctuation before newlines, runs of spaces
    and newlines, CRLF, tabs, multi-byte characters and emoji, lines of every length."""
    rng = random.Random(seed)
    pieces = ["word", "cat", "größe", "日本語", "🙂", "12345", "3.14", "x", "don't", "WE'LL", ".",
              ",", "(", ")", "==", "#", "'s"]  # fmt: skip
    gaps = [" ", " ", " ", "  ", "   ", "\n", "\n", "\n\n", " \n", "\r\n", "\t", ".\n", "\n  "]
    out: list[str] = []
    total = 0
    while total < size:
        part = rng.choice(pieces) + rng.choice(gaps) if rng.random() < 0.97 else SAMPLE
        out.append(part)
        total += len(part)
    return "".join(out)


def llama3_bpe(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))  # fmt: skip
    return tok


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chunks") / "big.txt"
    path.write_bytes(hostile_text(200_000).encode("utf-8"))
    return path


@pytest.mark.parametrize("kind", ["gpt2", "llama3"])
@pytest.mark.parametrize(("chunk", "block"), [(600, 7), (5_000, 4_096)])
def test_the_pieces_tokenise_as_the_whole_text(big: Path, kind: str, chunk: int, block: int) -> None:
    text = big.read_text(encoding="utf-8")  # what `lmcore eval --text` read before it streamed
    tok = byte_level_bpe([text[:20_000]], 400) if kind == "gpt2" else llama3_bpe([text[:20_000]])

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids  # type: ignore[no-any-return]

    pieces = list(text_chunks(big, encode, chunk=chunk, block=block))
    assert "".join(pieces) == text  # every character once, CRLF read as "\n" as read_text reads it
    assert len(pieces) > len(text) // chunk  # cut every chunk characters or more often
    assert max(len(p) for p in pieces) <= chunk + CUT_CHECK
    assert [i for p in pieces for i in encode(p)] == encode(text)
    assert utf8_size(big, block=block) == len(text.encode("utf-8"))


def test_a_tokenizer_that_merges_across_every_cut_is_refused_by_name(tmp_path: Path) -> None:
    # a normalizer that prepends a character to every input: no cut tokenises apart as together
    tok = byte_level_bpe(["a b\nc"] * 5, 300)
    tok.normalizer = normalizers.Prepend("_")
    path = tmp_path / "t.txt"
    path.write_text("ab cd\nef " * 400, encoding="utf-8")

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids  # type: ignore[no-any-return]

    with raises_naming(EvalError, "t.txt", "no place to cut", "at most 2,000 characters",
                       "split the file"):  # fmt: skip
        list(text_chunks(path, encode, chunk=300, block=64, limit=2_000))


def test_a_byte_that_is_not_utf8_is_named_with_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("é".encode() * 10 + b"caf\xe9" + b"x" * 100)
    for block in (1, 3, 4096):  # the bad byte in a block of its own, after a split sequence
        with raises_naming(EvalError, "latin1.txt", "is not UTF-8", "at byte 23"):
            utf8_size(path, block=block)
