"""`lmcore data prepare`: text files → a byte-level BPE tokenizer and flat token-id files.

    prepare(["corpus/"], "data/corpus", vocab_size=10_000, val_fraction=0.1)

Two streaming passes over the sources, each holding one chunk of text at a time:

1. train a byte-level BPE tokenizer with Hugging Face `tokenizers` from an iterator over the
   text (skipped when a tokenizer is reused); the end-of-text token `<|endoftext|>` is special,
   so no merge ever spans it;
2. encode the text in batches of chunks (`encode_batch_fast`, in parallel across chunks), cut
   the id stream into blocks and append each block to `train.bin` or `val.bin` (meta.py states
   the document and split rules).

The new directory is built whole in a hidden directory beside the output directory
(`.DIR.<random>.tmp`) and takes its place only when complete (`lmcore.locks.new_directory`):
an interrupted or failed run leaves the old data as it was (with `force` too), never a mix or a
shorter `train.bin` that looks complete; what a killed run left beside it is removed by the
next. A lock (`.DIR.lock` beside it) keeps a second `prepare` of the same directory out while
one runs: it is refused at once, naming the process.

Memory does not grow with the corpus: text is read in chunks (`lmcore.data.sources`), encoded
in batches of `batch_bytes`, and the tokenizer's trainer, which holds every distinct word, is
fed at most `LONG_RUNS` characters of runs that are not words (`_training_text`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from lmcore.atomic import atomic_path
from lmcore.data.meta import (
    BYTES,
    DATA_FILES,
    DEFAULT_SPLIT_BLOCK,
    DEFAULT_VAL_FRACTION,
    DEFAULT_VOCAB_SIZE,
    EOT,
    META_FILE,
    MIN_VOCAB,
    SPLITS,
    STARTS_DTYPE,
    STARTS_SUFFIX,
    DataMeta,
    SourceInfo,
    SplitInfo,
    dtype_for,
    file_dtype,
)
from lmcore.data.sources import (
    CHUNK_BYTES,
    DEFAULT_EXTENSIONS,
    SourceFile,
    check_utf8,
    find_files,
    normalise_extensions,
    read_chunks,
    safe_cut,
)
from lmcore.errors import DataError
from lmcore.locks import new_directory
from lmcore.runfiles import TOKENIZER_FILE
from lmcore.version import versions

if TYPE_CHECKING:
    from tokenizers import Tokenizer

MAX_VOCAB = 2**32  # ids must fit uint32
# Text encoded per call of encode_batch_fast, which runs its inputs (chunks, files) in parallel.
# Every token of a batch is held as an Encoding with its string, ~100 bytes per token, so a
# batch bounds the memory of the encoding pass: 2 MiB of text holds ~130 MiB at the peak.
BATCH_BYTES = 2 << 20
# Runs of letters (or of digits, or of punctuation) this long are not words: the tokenizer
# trains on at most LONG_RUNS characters of them, in pieces of RUN_PIECE (`_training_text`), so
# its trainer holds at most some 250 MB for them however much such text there is.
RUN_PIECE = 256
LONG_RUNS = 2 << 20
_LONG_RUN = re.compile(  # letters; digits; punctuation: as GPT-2's pre-tokens group them
    rf"[^\W\d_]{{{RUN_PIECE},}}|\d{{{RUN_PIECE},}}|[^\w\s]{{{RUN_PIECE},}}"
)


@dataclass(frozen=True)
class PrepareResult:
    """What `prepare` wrote and how long each pass took."""

    out_dir: Path
    meta: DataMeta
    seconds: float  # the whole call
    tokenizer_seconds: float  # training the tokenizer; 0 when one was reused
    encode_seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Encoding throughput: tokens written per second of the encoding pass."""
        return self.meta.tokens / max(self.encode_seconds, 1e-9)


def prepare(
    sources: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    tokenizer: str | os.PathLike[str] | None = None,
    force: bool = False,
    extensions: Sequence[str] = DEFAULT_EXTENSIONS,
    exclude: Sequence[str] = (),
    split_block: int = DEFAULT_SPLIT_BLOCK,
    context_length: int = 1,
    skip_undecodable: bool = False,
    progress: bool | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    batch_bytes: int = BATCH_BYTES,
) -> PrepareResult:
    """Tokenise text files into `out_dir`: train.bin, val.bin, tokenizer.json, meta.json.

    sources: files (always read) and directories (walked recursively for `extensions`, minus
        hidden paths and `exclude` globs; see `lmcore.data.sources`).
    vocab_size: of the BPE trained here (default 10,000; at least 257: the 256 byte values
        and <|endoftext|>). Not allowed with `tokenizer`, which brings its own.
    val_fraction: share of the tokens that goes to val.bin, in (0, 1).
    tokenizer: a tokenizer.json to reuse instead of training one: a GPT-2-style byte-level
        BPE (no normaliser) with <|endoftext|> as an added token, e.g. one this command wrote.
    force: replace what `out_dir` holds, whole, once the new data is complete; without it a
        directory that is not empty is an error.
    split_block: longest run of tokens kept together when assigning blocks to the splits.
    context_length: each split must hold at least one window of `context_length + 1` tokens.
    skip_undecodable: leave out files that are not UTF-8 (listed in meta.json) instead of
        failing on the first one.
    progress: tqdm bars on stderr; None shows them only when stderr is a terminal.
    chunk_bytes, batch_bytes: bytes read per chunk and text encoded per parallel batch; the
        output does not depend on them.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    _check_options(vocab_size, tokenizer, val_fraction, split_block, context_length)
    if chunk_bytes < 1 or batch_bytes < 1:
        raise DataError(f"chunk_bytes, batch_bytes must be ≥ 1, got {chunk_bytes}, {batch_bytes}")
    if not sources:
        raise DataError("no sources given; name text files or directories to read")
    exts = normalise_extensions(extensions)
    _check_out_dir(out, force)
    source_paths = [Path(s) for s in sources]
    keep_out = [("SOURCE", s) for s in source_paths]  # a reused tokenizer is copied, so it may be
    # Everything is built in a hidden directory beside `out`, which takes its place when
    # complete (under a lock: a second prepare of `out` meanwhile is refused, naming this one).
    with new_directory(
        out,
        force=force,
        what="--out",
        error=DataError,
        fix="pass --force to replace it whole, or choose another --out",
        keep_out=keep_out,
    ) as tmp:
        result = _prepare(
            source_paths, out, tmp, vocab_size, val_fraction, tokenizer, exts, exclude,
            split_block, context_length, skip_undecodable, progress, chunk_bytes, batch_bytes,
        )  # fmt: skip
    return dataclasses.replace(result, seconds=time.perf_counter() - start)


def _prepare(
    source_paths: list[Path],
    out: Path,
    tmp: Path,
    vocab_size: int | None,
    val_fraction: float,
    tokenizer: str | os.PathLike[str] | None,
    exts: tuple[str, ...],
    exclude: Sequence[str],
    split_block: int,
    context_length: int,
    skip_undecodable: bool,
    progress: bool | None,
    chunk_bytes: int,
    batch_bytes: int,
) -> PrepareResult:
    """`prepare`'s work, writing into `tmp` (which becomes `out`)."""
    files = find_files(source_paths, extensions=exts, exclude=exclude, skip=out)
    skipped: list[str] = []
    if skip_undecodable:
        good = []
        for f in files:
            bad = check_utf8(f.path, chunk_bytes)
            if bad is None:
                good.append(f)
            else:
                skipped.append(f"{f.path}: not UTF-8 at byte offset {bad.offset}")
        files = good
    total_bytes = sum(f.size for f in files)
    if total_bytes == 0:
        raise DataError(
            f"the sources hold no text: {len(files)} file(s), all empty"
            + (f", {len(skipped)} skipped as not UTF-8" if skipped else "")
            + "; give files with text in them"
        )

    tokenizer_seconds = 0.0
    if tokenizer is not None:
        tok = load_tokenizer(Path(tokenizer))
    else:
        t0 = time.perf_counter()
        wanted = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
        # No text of B bytes yields more than B merges: asking the trainer for more only makes
        # it reserve memory for tokens that cannot exist (a vocabulary of 10**9 aborts it).
        tok = train_tokenizer(
            _training_text(files, chunk_bytes, _bar("tokenizer", total_bytes, progress)),
            min(wanted, MIN_VOCAB + total_bytes),
        )
        tokenizer_seconds = time.perf_counter() - t0
    vocab = tok.get_vocab_size()
    eot_id = tok.token_to_id(EOT)
    assert eot_id is not None  # train_tokenizer adds it; load_tokenizer checks it
    dtype = dtype_for(vocab)

    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        writers: dict[str, _SplitWriter] = {}
        for name in SPLITS:
            path = stack.enter_context(atomic_path(tmp / f"{name}.bin"))
            starts = stack.enter_context(atomic_path(tmp / f"{name}{STARTS_SUFFIX}"))
            writers[name] = stack.enter_context(_SplitWriter(path, name, dtype, eot_id, starts))
        splitter = _Splitter(val_fraction, split_block, eot_id, writers["train"], writers["val"])
        bar = _bar("encode", total_bytes, progress)
        _encode(files, tok, eot_id, splitter, chunk_bytes, batch_bytes, bar)
        bar.close()
        encode_seconds = time.perf_counter() - t0
        _check_windows(writers, context_length, val_fraction, split_block)
    meta = DataMeta(
        vocab_size=vocab,
        dtype=dtype,
        eot_id=eot_id,
        splits={
            n: SplitInfo(f"{n}.bin", w.tokens, w.documents, f"{n}{STARTS_SUFFIX}", w.starts)
            for n, w in writers.items()
        },
        val_fraction=val_fraction,
        split_block=split_block,
        sources=_source_info(source_paths, files),
        extensions=exts,
        exclude=tuple(exclude),
        skipped=tuple(skipped),
        tokenizer_from=None if tokenizer is None else os.path.abspath(tokenizer),
        versions=versions("tokenizers", "numpy"),
    )
    with atomic_path(tmp / TOKENIZER_FILE) as path:
        tok.save(str(path))
    meta.write(tmp / META_FILE)
    return PrepareResult(
        out_dir=out,
        meta=meta,
        seconds=0.0,
        tokenizer_seconds=tokenizer_seconds,
        encode_seconds=encode_seconds,
    )


# --- options and the output directory ------------------------------------------------------


def _check_options(
    vocab_size: int | None,
    tokenizer: str | os.PathLike[str] | None,
    val_fraction: float,
    split_block: int,
    context_length: int,
) -> None:
    if vocab_size is not None and tokenizer is not None:
        raise DataError(
            f"--vocab-size {vocab_size} and --tokenizer {os.fspath(tokenizer)} both given; a "
            "reused tokenizer brings its own vocabulary: drop --vocab-size"
        )
    if vocab_size is not None and not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise DataError(
            f"--vocab-size {vocab_size} "
            + (
                f"is smaller than the byte alphabet ({BYTES}) plus {EOT}: use at least "
                f"{MIN_VOCAB} (e.g. {DEFAULT_VOCAB_SIZE})"
                if vocab_size < MIN_VOCAB
                else f"does not fit uint32 token ids: use at most {MAX_VOCAB:,}"
            )
        )
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise DataError(
            f"--val-fraction {val_fraction} is out of range: it is the share of tokens for "
            f"val.bin, strictly between 0 and 1 (e.g. {DEFAULT_VAL_FRACTION})"
        )
    if split_block < 1:
        raise DataError(f"--split-block {split_block} must be at least 1 token")
    if context_length < 1:
        raise DataError(f"--context-length {context_length} must be at least 1")


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {str(out)!r} is a file, not a directory; choose another --out")
    held = [name for name in DATA_FILES if (out / name).exists()]
    if held and not force:
        raise DataError(
            f"output directory {str(out)!r} already holds prepared data ({', '.join(held)}); "
            "nothing was written: pass --force to replace it, or choose another --out"
        )


def _check_windows(
    writers: dict[str, _SplitWriter], context_length: int, val_fraction: float, split_block: int
) -> None:
    need = context_length + 1
    total = sum(w.tokens for w in writers.values())
    docs = sum(w.documents for w in writers.values())
    for name, w in writers.items():
        if w.tokens < need:
            raise DataError(
                f"{name}.bin would hold {w.tokens:,} tokens, fewer than one window of "
                f"context_length + 1 = {need:,} (the text has {total:,} tokens in {docs:,} "
                f"documents); nothing was written: "
                + (
                    f"raise --val-fraction (now {val_fraction}) or lower --split-block (now "
                    f"{split_block}) so that a long document makes more blocks"
                    if name == "val"
                    else f"lower --val-fraction (now {val_fraction})"
                )
                + ", or add text"
                + (f", or lower --context-length (now {context_length})" if need > 2 else "")
            )


def _source_info(sources: Sequence[Path], files: Sequence[SourceFile]) -> tuple[SourceInfo, ...]:
    counts = [[0, 0] for _ in sources]
    for f in files:
        counts[f.source][0] += 1
        counts[f.source][1] += f.size
    return tuple(
        SourceInfo(path=os.path.abspath(s), files=n, bytes=b)
        for s, (n, b) in zip(sources, counts, strict=True)
    )


def summary_lines(r: PrepareResult) -> list[str]:
    """What `lmcore data prepare` (and `lmcore quickstart`) print of a `PrepareResult`."""
    m = r.meta
    total = m.tokens
    sources = f"{len(m.sources)} source{'s' if len(m.sources) != 1 else ''}"
    skipped = (
        f"; skipped {len(m.skipped)} not UTF-8 (meta.json lists them), e.g. {m.skipped[0]}"
        if m.skipped
        else ""
    )
    made = (
        f"trained in {r.tokenizer_seconds:.1f} s"
        if m.tokenizer_from is None
        else f"reused from {m.tokenizer_from}"
    )
    splits = ", ".join(
        f"{name} {s.tokens:,} ({100 * s.tokens / total:.1f}%, {s.documents:,} documents)"
        for name, s in m.splits.items()
    )
    index = [s.starts_file for s in m.splits.values() if s.starts_file is not None]
    starts = ", ".join(
        f"{name} {s.starts:,} (mean {s.tokens / max(s.starts, 1):,.0f} tokens)"
        for name, s in m.splits.items()
        if s.starts is not None
    )
    return [
        f"data: {r.out_dir}: train.bin, val.bin ({m.dtype}), {', '.join([*index, ''])}"
        "tokenizer.json, meta.json",
        f"text: {m.files:,} files, {m.bytes:,} bytes of UTF-8 from {sources}{skipped}",
        f"tokenizer: byte-level BPE, {m.vocab_size:,} tokens ({m.eot_token} = {m.eot_id}), {made}",
        f"tokens: {splits}",
        *([f"document starts: {starts} (the index of *.starts.bin)"] if starts else []),
        f"time: {r.seconds:.1f} s in all; encoding {total:,} tokens took "
        f"{r.encode_seconds:.1f} s, {r.tokens_per_second:,.0f} tokens/s",
    ]


# --- the tokenizer -------------------------------------------------------------------------


def new_tokenizer() -> Tokenizer:
    """An untrained GPT-2-style byte-level BPE: no normaliser, GPT-2's pre-tokenizer regex,
    no prefix space (so chunks encode like the whole), byte-level decoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (fewer if the text runs out of merges)
    from an iterable of texts, consumed as a stream; `<|endoftext|>` is id 0.

    Each text is split at the literal `<|endoftext|>` first: the trainer does not split out
    special tokens itself, and no merge should learn to span one.
    """
    from tokenizers import pre_tokenizers, trainers

    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # Its bars print blank lines on stdout even when hidden; the caller's bar on the
        # iterator shows the reading, the longer part.
        show_progress=False,
    )
    parts = (part for text in texts for part in text.split(EOT) if part)
    tok.train_from_iterator(parts, trainer)
    return tok


def _training_text(files: Sequence[SourceFile], chunk_bytes: int, bar: Any) -> Iterator[str]:
    """The text of every file, in chunks, less the long runs past `LONG_RUNS`' budget.

    The trainer holds every distinct word (pre-token) it sees, about 120 bytes per character,
    and in long runs of letters, digits or punctuation with no space (random or DNA-like text)
    every word is distinct: 50 MB of them would need some 6 GB. So the first `LONG_RUNS`
    characters of such runs are fed in `RUN_PIECE`-character pieces, and later ones are left
    out of training (they are still encoded, with the merges learnt from the rest).
    """
    budget = LONG_RUNS
    for f in files:
        for text in read_chunks(f.path, chunk_bytes, bar.update):
            # most text has no long run: a cheap check first (str.split runs at C speed, the
            # regex below at a tenth of it)
            if len(text) < RUN_PIECE or max(map(len, text.split()), default=0) < RUN_PIECE:
                yield text
                continue
            pos = 0
            for m in _LONG_RUN.finditer(text):
                yield text[pos : m.start()]
                run = m.group()[:budget]
                budget -= len(run)
                yield from (run[i : i + RUN_PIECE] for i in range(0, len(run), RUN_PIECE))
                pos = m.end()
            yield text[pos:]
    bar.set_postfix_str("read; computing merges")
    bar.close()


def load_tokenizer(path: Path) -> Tokenizer:
    """Load a tokenizer.json to reuse, checking that chunked encoding stays exact with it."""
    from tokenizers import Tokenizer, pre_tokenizers

    if not path.is_file():
        raise DataError(
            f"--tokenizer {str(path)!r} does not exist; give a tokenizer.json, e.g. the one "
            "in a directory lmcore data prepare wrote"
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for unparsable files
        raise DataError(
            f"--tokenizer {str(path)!r} is not a Hugging Face tokenizer.json ({e})"
        ) from None
    config = json.loads(tok.to_str())
    pre = config.get("pre_tokenizer") or {}
    problems = []
    if (config.get("model") or {}).get("type") != "BPE":
        problems.append(f"its model is {(config.get('model') or {}).get('type')}, not BPE")
    if config.get("normalizer") is not None:
        problems.append(f"it has a normalizer ({config['normalizer'].get('type')})")
    if pre.get("type") != "ByteLevel":
        problems.append(f"its pre_tokenizer is {pre.get('type')}, not ByteLevel")
    elif pre.get("add_prefix_space", True) or not pre.get("use_regex", True):
        problems.append("its ByteLevel pre_tokenizer needs add_prefix_space=false, use_regex=true")
    vocab = tok.get_vocab()
    missing = [c for c in pre_tokenizers.ByteLevel.alphabet() if c not in vocab]
    if missing:
        problems.append(f"{len(missing)} of the 256 byte symbols are not in its vocabulary")
    added = config.get("added_tokens") or []
    if EOT not in {t.get("content") for t in added}:
        problems.append(f"it has no added token {EOT}")
    # An added token is matched across the whole text before pre-tokenization: one that could
    # span a chunk boundary, or swallow the whitespace beside it, would encode chunks unlike
    # the whole.
    spanning = [
        t.get("content")
        for t in added
        if t.get("lstrip") or t.get("rstrip") or safe_cut(str(t.get("content", "")))
    ]
    if spanning:
        shown = ", ".join(repr(c) for c in spanning[:3]) + (", ..." if len(spanning) > 3 else "")
        problems.append(
            f"{len(spanning)} added token(s) join text and whitespace or strip whitespace ({shown})"
        )
    if problems:
        raise DataError(
            f"--tokenizer {str(path)!r} cannot be reused: {'; '.join(problems)}. lmcore reuses "
            f"GPT-2-style byte-level BPE tokenizers with {EOT} (like those it writes, or "
            "GPT-2's), whose chunks encode exactly like the whole text; leave out --tokenizer "
            "to train one"
        )
    return tok


# --- encoding and splitting ----------------------------------------------------------------


class _SplitWriter:
    """Token ids appended to one split's (temporary) file, counted as they go; and, when given
    `starts_path`, the split's document index: the offset of each document's first token."""

    def __init__(
        self, path: Path, name: str, dtype: str, eot_id: int, starts_path: Path | None = None
    ):
        self.name, self.dtype, self.eot_id = name, file_dtype(dtype), eot_id
        self.file: IO[bytes] = path.open("wb")
        self.starts_file: IO[bytes] | None = None if starts_path is None else starts_path.open("wb")
        self.tokens = 0
        self.documents = 0  # end-of-text tokens written
        self.starts = 0  # document index entries written

    def write(self, ids: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(ids, dtype=self.dtype).data)
        self.tokens += len(ids)
        self.documents += int(np.count_nonzero(ids == self.eot_id))

    def start_document(self) -> None:
        """The next token written begins a document (meta.STARTS_RULE)."""
        if self.starts_file is not None:  # 8 bytes through the file's buffer: memory stays flat
            self.starts_file.write(np.array([self.tokens], dtype=STARTS_DTYPE).data)
            self.starts += 1

    def __enter__(self) -> _SplitWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        if self.starts_file is not None:
            self.starts_file.close()


class _Splitter:
    """Routes the id stream to train or val by blocks (meta.SPLIT_RULE).

    A block ends after an end-of-text token or after `block` tokens; its split is chosen when
    it starts, from the counts so far alone, so the result does not depend on how the stream
    is chunked. The first block goes to train.
    """

    def __init__(
        self, fraction: float, block: int, eot_id: int, train: _SplitWriter, val: _SplitWriter
    ):
        self.fraction, self.block, self.eot_id = fraction, block, eot_id
        self.train, self.val = train, val
        self.current: _SplitWriter | None = None  # None: the next token starts a block
        self.left = 0  # tokens the current block may still take
        # The previous block's split, and whether it ended a document: a block begins a
        # document in its split unless it continues the block before it there (STARTS_RULE).
        self.previous: _SplitWriter | None = None
        self.ended = True

    def add(self, ids: np.ndarray) -> None:
        ends = np.flatnonzero(ids == self.eot_id) + 1  # a block ends after each end-of-text
        pos, n = 0, len(ids)
        while pos < n:
            if self.current is None:
                seen = self.train.tokens + self.val.tokens
                self.current = self.val if self.val.tokens < self.fraction * seen else self.train
                self.left = self.block
                if self.ended or self.current is not self.previous:
                    self.current.start_document()
            k = int(np.searchsorted(ends, pos, side="right"))
            next_end = int(ends[k]) if k < len(ends) else n + 1
            stop = min(pos + self.left, n, next_end)
            self.current.write(ids[pos:stop])
            self.left -= stop - pos
            if stop == next_end or self.left == 0:
                self.previous, self.ended = self.current, stop == next_end
                self.current = None
            pos = stop


def _encode(
    files: Sequence[SourceFile],
    tok: Tokenizer,
    eot_id: int,
    splitter: _Splitter,
    chunk_bytes: int,
    batch_bytes: int,
    bar: Any,
) -> None:
    """Encode every file, chunk by chunk, in parallel batches; append <|endoftext|> after a file
    unless its text already ends with it."""
    texts: list[str] = []
    ends_file: list[bool] = []
    held = 0

    def flush() -> None:
        encoded = tok.encode_batch_fast(texts, add_special_tokens=False)
        for enc, last in zip(encoded, ends_file, strict=True):
            ids = np.array(enc.ids, dtype=np.uint32)
            splitter.add(ids)
            if last and (len(ids) == 0 or ids[-1] != eot_id):
                splitter.add(np.array([eot_id], dtype=np.uint32))
        bar.set_postfix_str(f"{splitter.train.tokens + splitter.val.tokens:,} tokens")
        texts.clear()
        ends_file.clear()

    def add(text: str, last: bool) -> None:
        nonlocal held
        texts.append(text)
        ends_file.append(last)
        held += len(text)
        if held >= batch_bytes:
            flush()
            held = 0

    protect = tuple(t.content for t in tok.get_added_tokens_decoder().values()) or (EOT,)
    for f in files:
        previous: str | None = None
        for chunk in read_chunks(f.path, chunk_bytes, bar.update, protect=protect):
            if previous is not None:
                add(previous, False)
            previous = chunk
        if previous is not None:
            add(previous, True)
    if texts:
        flush()


def _bar(what: str, total: int, progress: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=what,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=None if progress is None else not progress,
        leave=True,
    )
