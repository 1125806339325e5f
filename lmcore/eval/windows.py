"""Loss, perplexity and bits per byte of a model over a token stream, in windows.

    stream = text_stream(["a.py", "b.py"], tokenizer)      # or data_stream(TokenData, "val")
    result = evaluate_stream(model, stream, batch_size=8, stride=64)
    result.loss, result.perplexity, result.bits_per_byte

Streams are read chunk by chunk (`Stream.chunks`): a text's files are read and tokenised in
bounded pieces (`lmcore.eval.chunking`, cut where the tokenizer does not merge across, so the ids
are those of each file tokenised whole), and windows are scored as soon as their tokens are
there, so memory is bounded by a chunk and a batch of windows, not by the text.

Every token of the stream but the first is predicted exactly once. A window holds up to
`context_length` input tokens; windows start every `stride` tokens (default: the context
length, non-overlapping windows) and each scores only the targets the previous window did not,
so with a smaller stride every scored token sees at least `context_length - stride` tokens of
context. Windows are batched (the last, shorter one right-padded: causal attention keeps the
pads out of every real position), each window's loss is summed in float64 from its own row
alone, and the windows' sums are added in order, so the numbers do not depend on the batch size.

Chat data has a loss mask beside its tokens (`lmcore data prepare --chat`): a target whose mask
is 0 (a prompt's token) is read as context but neither scored nor counted, so `loss` is the mean
over the assistant's tokens alone, as the trainer's masked evaluation computes it, and `bytes`
are the scored tokens' bytes. The mask travels with the ids through the windows: a masked
stream's chunks are `(2, n)` arrays, ids above, mask below.

A text stream is the files one after another, each one a document led by `<|endoftext|>`, as
`lmcore data prepare` separates documents: `<|endoftext|> file1 <|endoftext|> file2 ...`. Its
bytes are those of the files' text (see `lmcore.eval.bpb`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from lmcore.errors import EvalError
from lmcore.eval.bpb import bits_per_byte, token_bytes
from lmcore.eval.chunking import BLOCK_BYTES, CHUNK_CHARS, text_chunks, utf8_size
from lmcore.eval.scoring import target_log_probs

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lmcore.data.tokens import TokenData
    from lmcore.model.transformer import TransformerLM

__all__ = [
    "EvalResult",
    "Stream",
    "TextStream",
    "Tokens",
    "Window",
    "count_windows",
    "data_stream",
    "evaluate_stream",
    "plan_windows",
    "streamed_windows",
    "text_stream",
]

EOT = "<|endoftext|>"


@dataclass(frozen=True)
class Window:
    """Inputs `tokens[start : start + length]`, targets one further; the last `scored` count."""

    start: int
    length: int
    scored: int


def _check_stride(stride: int, context_length: int) -> None:
    if not 1 <= stride <= context_length:
        raise EvalError(
            f"--stride {stride}: must be in 1..{context_length} (the context length); "
            f"{context_length} gives non-overlapping windows, less gives every token more context"
        )


def _too_short(tokens: int) -> EvalError:
    return EvalError(
        f"the text holds {tokens} token{'s' * (tokens != 1)}: nothing to predict; give more text"
    )


def plan_windows(tokens: int, context_length: int, stride: int | None = None) -> list[Window]:
    """The windows over a stream of `tokens` ids that predict each of `tokens[1:]` once."""
    stride = context_length if stride is None else stride
    _check_stride(stride, context_length)
    if tokens < 2:
        raise _too_short(tokens)
    out, start, done = [], 0, 0  # done: the last target index scored so far
    while True:
        end = min(start + context_length, tokens - 1)  # inputs [start, end), targets to end
        out.append(Window(start, end - start, end - done))
        done = end
        if end == tokens - 1:
            return out
        start += stride


def count_windows(tokens: int, context_length: int, stride: int) -> int:
    """`len(plan_windows(tokens, context_length, stride))`, without planning them."""
    if tokens - 1 <= context_length:
        return 1
    return 1 + -(-(tokens - 1 - context_length) // stride)


class Tokens(Protocol):
    """What `evaluate_stream` reads: token ids chunk by chunk, and what they are."""

    @property
    def bytes(self) -> np.ndarray: ...  # int64, bytes of each token id (`token_bytes`)
    @property
    def masked(self) -> bool: ...  # chunks are (2, n): ids, then the loss mask (1: scored)
    @property
    def source(self) -> str: ...
    @property
    def tokenizer(self) -> str: ...
    def chunks(self) -> Iterator[np.ndarray]: ...
    def length(self) -> int | None: ...  # the ids in all, when known without reading them


_DATA_CHUNK = 1 << 20  # token ids of prepared data read at a time


@dataclass(frozen=True)
class Stream:
    """Token ids to evaluate (in memory, or a memory map), the bytes each predicted token
    stands for, and what they are."""

    tokens: np.ndarray  # the whole stream
    bytes: np.ndarray  # int64, bytes of each token (its tokenizer's `token_bytes`)
    source: str  # e.g. "val split of data/stdlib-2k"
    tokenizer: str  # where the tokenizer came from
    mask: np.ndarray | None = None  # uint8 beside `tokens`, 1: a scored target (chat data)

    def __post_init__(self) -> None:
        if self.mask is not None and len(self.mask) != len(self.tokens):
            raise EvalError(
                f"{self.source}: the loss mask holds {len(self.mask):,} entries for "
                f"{len(self.tokens):,} tokens"
            )

    @property
    def masked(self) -> bool:
        return self.mask is not None

    def chunks(self) -> Iterator[np.ndarray]:
        """The ids in int64 pieces (a memory map is read a piece at a time); with a loss mask,
        `(2, n)` pieces: the ids, then their mask."""
        for i in range(0, len(self.tokens), _DATA_CHUNK):
            ids = np.asarray(self.tokens[i : i + _DATA_CHUNK], dtype=np.int64)
            if self.mask is None:
                yield ids
            else:
                yield np.stack([ids, np.asarray(self.mask[i : i + _DATA_CHUNK], dtype=np.int64)])

    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class TextStream:
    """Text files as one stream, read and tokenised chunk by chunk (`chunks`): each file led by
    `<|endoftext|>`, its text cut where the tokenizer does not merge across
    (`lmcore.eval.chunking`), so the ids are those of each file tokenised whole."""

    files: tuple[Path, ...]
    encoder: Tokenizer = field(repr=False)
    eot: int
    bytes: np.ndarray
    source: str  # e.g. "2 files (12,345 bytes)"
    tokenizer: str
    chunk: int = CHUNK_CHARS  # characters tokenised at a time
    block: int = BLOCK_BYTES  # bytes read at a time
    masked: bool = field(default=False, init=False)  # every token of a text is scored

    def _encode(self, text: str) -> list[int]:
        ids: list[int] = self.encoder.encode(text, add_special_tokens=False).ids
        return ids

    def chunks(self) -> Iterator[np.ndarray]:
        for path in self.files:
            yield np.array([self.eot], dtype=np.int64)
            for piece in text_chunks(path, self._encode, chunk=self.chunk, block=self.block):
                yield np.array(self._encode(piece), dtype=np.int64)

    def length(self) -> None:
        return None  # known once read


def text_stream(
    files: Sequence[str | os.PathLike[str]],
    tokenizer: Tokenizer,
    where: str = "",
    *,
    chunk: int = CHUNK_CHARS,
    block: int = BLOCK_BYTES,
) -> TextStream:
    """The files as one stream: `<|endoftext|>` before each (see the module's docstring). Each
    file is read once here, in blocks, to refuse one that is not UTF-8 before anything is
    evaluated and to count its bytes; its tokens are read as they are evaluated."""
    eot = tokenizer.token_to_id(EOT)
    if eot is None:
        raise EvalError(
            f"the tokenizer {where!r} has no {EOT} token to separate documents; use the "
            "tokenizer the model was trained with (lmcore data prepare adds it)"
        )
    paths = tuple(Path(f) for f in files)
    size = sum(utf8_size(p, "--text", block) for p in paths)
    shown = str(files[0]) if len(files) == 1 else f"{len(files)} files"
    return TextStream(
        paths, tokenizer, eot, token_bytes(tokenizer), f"{shown} ({size:,} bytes)", where,
        chunk, block,
    )  # fmt: skip


def data_stream(data: TokenData, split: str = "val") -> Stream:
    """A split of prepared data; its bytes come from decoding with the data's tokenizer. Chat
    data's loss mask comes with it: only the targets it keeps are scored."""
    where = str(data.path / data.meta.tokenizer_file)
    ids = data.split(split)  # a memory map: `Stream.chunks` reads it a piece at a time
    mask = data.mask(split)
    source = f"{split} split of {data.path}" + (" (loss-masked)" if mask is not None else "")
    return Stream(ids, token_bytes(data.tokenizer()), source, where, mask)


@dataclass(frozen=True)
class EvalResult:
    """What `lmcore eval --text/--data` reports. `batch_size`: the most windows one forward
    took (the batch asked for, or fewer when there are fewer windows)."""

    source: str
    tokenizer: str
    tokens: int  # predicted (scored: a loss mask leaves the prompt's tokens out)
    bytes: int  # that the predicted tokens stand for
    nats: float  # summed over the predicted tokens
    windows: int
    context_length: int
    stride: int
    batch_size: int
    seconds: float
    masked: int = 0  # targets read as context but left out by the data's loss mask

    @property
    def loss(self) -> float:
        """Mean nats per predicted token."""
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss) if self.loss < 700 else math.inf

    @property
    def bits_per_byte(self) -> float:
        return bits_per_byte(self.nats, self.bytes)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
            "tokens_per_s": self.tokens / self.seconds if self.seconds > 0 else None,
        }


@torch.inference_mode()
def window_nats(
    model: TransformerLM,
    tokens: np.ndarray,
    windows: Sequence[Window],
    width: int,
    offset: int = 0,
) -> list[float]:
    """The summed nats of each window's scored targets, one forward for all of them, each row
    right-padded to `width` (the same in every batch, so that no row's arithmetic depends on
    the others'). `tokens[i]` is the stream's token `offset + i`; `(2, n)` tokens carry a loss
    mask below the ids, and a target whose mask is 0 adds nothing."""
    device = model.lm_head.weight.device
    ids, mask = (tokens, None) if tokens.ndim == 1 else (tokens[0], tokens[1])
    x = np.zeros((len(windows), width), dtype=np.int64)
    y = np.zeros((len(windows), width), dtype=np.int64)
    kept = np.ones((len(windows), width), dtype=bool)
    for row, w in enumerate(windows):
        s = w.start - offset
        x[row, : w.length] = ids[s : s + w.length]
        y[row, : w.length] = ids[s + 1 : s + w.length + 1]
        if mask is not None:
            kept[row, : w.length] = mask[s + 1 : s + w.length + 1] != 0
    logits = model(torch.from_numpy(x).to(device))
    picked = target_log_probs(logits, torch.from_numpy(y).to(device))  # (B, T)
    if mask is not None:  # where, not multiply: a left-out target's -inf must not make a nan
        picked = torch.where(torch.from_numpy(kept).to(device), picked, 0.0)
    return [
        float(picked[row, w.length - w.scored : w.length].double().sum().neg())
        for row, w in enumerate(windows)
    ]


class _Sum:
    """An exactly rounded running sum: `math.fsum` of every value added, kept as Shewchuk's
    non-overlapping partials (a few floats) rather than a list of every value."""

    def __init__(self) -> None:
        self.partials: list[float] = []

    def add(self, x: float) -> None:
        kept = []
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                kept.append(lo)
            x = hi
        kept.append(x)
        self.partials = kept

    def total(self) -> float:
        return math.fsum(self.partials)


def streamed_windows(
    chunks: Iterator[np.ndarray], context_length: int, stride: int, batch_size: int
) -> Iterator[tuple[list[Window], np.ndarray, int, int]]:
    """`(windows, tokens, offset, width)` batch by batch: the windows `plan_windows` gives for
    the whole stream, `batch_size` at a time, planned as the chunks arrive; `tokens[..., i]` is
    the stream's token `offset + i` (what the batch reads, and no more than it needs); `width`
    is the first window's length. A window is planned once the tokens after it show it is not
    the last, or the stream has ended. Chunks are 1-D ids, or `(2, n)` ids and loss mask, all
    alike (the buffer grows along the last axis)."""
    L = context_length
    buf: np.ndarray | None = None
    offset = start = done = width = 0  # buf[0] is token `offset`; the next window starts at `start`
    batch: list[Window] = []
    ended = False
    while not ended:
        piece = next(chunks, None)
        if piece is None:
            ended = True
        elif piece.shape[-1]:
            buf = piece if buf is None else np.concatenate([buf, piece], axis=-1)
        if buf is None:
            buf = np.empty(0, dtype=np.int64)
        n = offset + buf.shape[-1]  # tokens seen so far
        while ended or n >= start + L + 2:  # else: whether it is the last is not known yet
            if n < 2:
                raise _too_short(n)
            end = min(start + L, n - 1)
            batch.append(Window(start, end - start, end - done))
            width, done = width or end - start, end
            last = end == n - 1
            if len(batch) == batch_size or last:
                yield batch, buf, offset, width
                batch = []
            if last:
                return
            start += stride
            if not batch:  # drop what no window to come reads
                buf, offset = buf[..., start - offset :], start


def evaluate_stream(
    model: TransformerLM,
    stream: Tokens,
    *,
    batch_size: int = 8,
    stride: int | None = None,
    context: int | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Evaluate `model` on every predicted token of `stream` (see the module's docstring),
    reading it chunk by chunk, in windows of up to `context` tokens (None: the model's
    context length). `progress`: a tqdm bar on stderr (None: when stderr is a terminal)."""
    from tqdm import tqdm

    if batch_size < 1:
        raise EvalError(f"--batch-size {batch_size}: must be a positive integer")
    spec = model.spec
    if context is not None and not 1 <= context <= spec.context_length:
        raise EvalError(
            f"--context {context}: must be in 1..{spec.context_length} (the model's "
            "context_length)"
        )
    L = spec.context_length if context is None else context
    step = L if stride is None else stride
    _check_stride(step, L)
    known = stream.length()
    if known is not None and known < 2:
        raise _too_short(known)
    table = stream.bytes
    seen = num_bytes = windows = largest = left_out = 0

    def checked() -> Iterator[np.ndarray]:
        nonlocal seen, num_bytes, left_out
        for piece in stream.chunks():
            ids = piece if piece.ndim == 1 else piece[0]
            if len(ids) and int(ids.max()) >= spec.vocab_size:
                raise EvalError(
                    f"{stream.source} holds token id {int(ids.max())}, beyond the model's "
                    f"vocab_size={spec.vocab_size}; evaluate with the tokenizer the model was "
                    "trained with"
                )
            targets = slice(1 if seen == 0 else 0, None)  # the first token is never a target
            if piece.ndim == 1:
                num_bytes += int(table[ids[targets]].sum())
            else:
                kept = piece[1, targets] != 0
                num_bytes += int(table[ids[targets][kept]].sum())
                left_out += int((~kept).sum())
            seen += len(ids)
            yield piece

    start = time.perf_counter()
    nats = _Sum()
    bar = tqdm(
        total=None if known is None else count_windows(known, L, step),
        unit="window",
        file=sys.stderr,
        disable=not sys.stderr.isatty() if progress is None else not progress,
        dynamic_ncols=True,
    )
    with bar:
        for batch, tokens, offset, width in streamed_windows(checked(), L, step, batch_size):
            for value in window_nats(model, tokens, batch, width, offset):
                nats.add(value)
            windows += len(batch)
            largest = max(largest, len(batch))
            bar.update(len(batch))
    if seen - 1 - left_out == 0:
        raise EvalError(
            f"{stream.source}: its loss mask leaves out all {left_out:,} targets, so nothing is "
            "scored; evaluate a split with assistant tokens in it"
        )
    return EvalResult(
        source=stream.source,
        tokenizer=stream.tokenizer,
        tokens=seen - 1 - left_out,
        bytes=num_bytes,
        nats=nats.total(),
        windows=windows,
        context_length=L,
        stride=step,
        batch_size=largest,
        seconds=time.perf_counter() - start,
        masked=left_out,
    )
