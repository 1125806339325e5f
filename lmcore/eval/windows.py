"""Loss, perplexity and bits per byte of a model over a token stream, in windows.

    stream = text_stream(["a.py", "b.py"], tokenizer)      # or data_stream(TokenData, "val")
    result = evaluate_stream(model, stream, batch_size=8, stride=64)
    result.loss, result.perplexity, result.bits_per_byte

Every token of the stream but the first is predicted exactly once. A window holds up to
`context_length` input tokens; windows start every `stride` tokens (default: the context
length, non-overlapping windows) and each scores only the targets the previous window did not,
so with a smaller stride every scored token sees at least `context_length - stride` tokens of
context. Windows are batched (the last, shorter one right-padded: causal attention keeps the
pads out of every real position), each window's loss is summed in float64 from its own row
alone, and the windows' sums are added in order, so the numbers do not depend on the batch size.

A text stream is the files one after another, each one a document led by `<|endoftext|>`, as
`lmcore data prepare` separates documents: `<|endoftext|> file1 <|endoftext|> file2 ...`. Its
bytes are those of the files' text (see `lmcore.eval.bpb`).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lmcore.errors import EvalError
from lmcore.eval.bpb import bits_per_byte, token_bytes
from lmcore.eval.scoring import target_log_probs

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lmcore.data.tokens import TokenData
    from lmcore.model.transformer import TransformerLM

__all__ = [
    "EvalResult",
    "Stream",
    "Window",
    "data_stream",
    "evaluate_stream",
    "plan_windows",
    "text_stream",
]

EOT = "<|endoftext|>"


@dataclass(frozen=True)
class Window:
    """Inputs `tokens[start : start + length]`, targets one further; the last `scored` count."""

    start: int
    length: int
    scored: int


def plan_windows(tokens: int, context_length: int, stride: int | None = None) -> list[Window]:
    """The windows over a stream of `tokens` ids that predict each of `tokens[1:]` once."""
    stride = context_length if stride is None else stride
    if not 1 <= stride <= context_length:
        raise EvalError(
            f"--stride {stride}: must be in 1..{context_length} (the context length); "
            f"{context_length} gives non-overlapping windows, less gives every token more context"
        )
    if tokens < 2:
        raise EvalError(
            f"the text holds {tokens} token{'s' * (tokens != 1)}: nothing to predict; give "
            "more text"
        )
    out, start, done = [], 0, 0  # done: the last target index scored so far
    while True:
        end = min(start + context_length, tokens - 1)  # inputs [start, end), targets to end
        out.append(Window(start, end - start, end - done))
        done = end
        if end == tokens - 1:
            return out
        start += stride


@dataclass(frozen=True)
class Stream:
    """Token ids to evaluate, the bytes each predicted token stands for, and what they are."""

    tokens: np.ndarray  # int64, the whole stream
    bytes: np.ndarray  # int64, bytes of each token (its tokenizer's `token_bytes`)
    source: str  # e.g. "2 files (12,345 bytes)" or "val split of data/stdlib-2k"
    tokenizer: str  # where the tokenizer came from


def text_stream(
    files: Sequence[str | os.PathLike[str]], tokenizer: Tokenizer, where: str = ""
) -> Stream:
    """The files as one stream: `<|endoftext|>` before each (see the module's docstring)."""
    eot = tokenizer.token_to_id(EOT)
    if eot is None:
        raise EvalError(
            f"the tokenizer {where!r} has no {EOT} token to separate documents; use the "
            "tokenizer the model was trained with (lmcore data prepare adds it)"
        )
    parts: list[list[int]] = []
    size = 0
    for f in files:
        path = Path(f)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise EvalError(f"--text {str(path)!r} is not UTF-8 text ({e.reason})") from None
        size += len(text.encode("utf-8"))
        parts.append([eot, *tokenizer.encode(text, add_special_tokens=False).ids])
    ids = np.fromiter((i for p in parts for i in p), dtype=np.int64)
    shown = str(files[0]) if len(files) == 1 else f"{len(files)} files"
    return Stream(ids, token_bytes(tokenizer), f"{shown} ({size:,} bytes)", where)


def data_stream(data: TokenData, split: str = "val") -> Stream:
    """A split of prepared data; its bytes come from decoding with the data's tokenizer."""
    ids = np.asarray(data.split(split), dtype=np.int64)
    where = str(data.path / data.meta.tokenizer_file)
    return Stream(ids, token_bytes(data.tokenizer()), f"{split} split of {data.path}", where)


@dataclass(frozen=True)
class EvalResult:
    """What `lmcore eval --text/--data` reports."""

    source: str
    tokenizer: str
    tokens: int  # predicted
    bytes: int  # that the predicted tokens stand for
    nats: float  # summed over the predicted tokens
    windows: int
    context_length: int
    stride: int
    batch_size: int
    seconds: float

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
    model: TransformerLM, tokens: np.ndarray, windows: Sequence[Window], width: int
) -> list[float]:
    """The summed nats of each window's scored targets, one forward for all of them, each row
    right-padded to `width` (the same in every batch, so that no row's arithmetic depends on
    the others')."""
    device = model.lm_head.weight.device
    x = np.zeros((len(windows), width), dtype=np.int64)
    y = np.zeros((len(windows), width), dtype=np.int64)
    for row, w in enumerate(windows):
        x[row, : w.length] = tokens[w.start : w.start + w.length]
        y[row, : w.length] = tokens[w.start + 1 : w.start + w.length + 1]
    logits = model(torch.from_numpy(x).to(device))
    picked = target_log_probs(logits, torch.from_numpy(y).to(device))  # (B, T)
    return [
        float(picked[row, w.length - w.scored : w.length].double().sum().neg())
        for row, w in enumerate(windows)
    ]


def evaluate_stream(
    model: TransformerLM,
    stream: Stream,
    *,
    batch_size: int = 8,
    stride: int | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Evaluate `model` on every predicted token of `stream` (see the module's docstring).
    `progress`: a tqdm bar on stderr (None: when stderr is a terminal)."""
    from tqdm import tqdm

    if batch_size < 1:
        raise EvalError(f"--batch-size {batch_size}: must be a positive integer")
    spec = model.spec
    if len(stream.tokens) and int(stream.tokens.max()) >= spec.vocab_size:
        raise EvalError(
            f"{stream.source} holds token id {int(stream.tokens.max())}, beyond the model's "
            f"vocab_size={spec.vocab_size}; evaluate with the tokenizer the model was trained with"
        )
    L = spec.context_length
    wins = plan_windows(len(stream.tokens), L, stride)
    start = time.perf_counter()
    nats: list[float] = []
    bar = tqdm(
        total=len(wins),
        unit="window",
        file=sys.stderr,
        disable=not sys.stderr.isatty() if progress is None else not progress,
        dynamic_ncols=True,
    )
    with bar:
        for i in range(0, len(wins), batch_size):
            batch = wins[i : i + batch_size]
            nats.extend(window_nats(model, stream.tokens, batch, wins[0].length))
            bar.update(len(batch))
    predicted = len(stream.tokens) - 1
    num_bytes = int(stream.bytes[stream.tokens[1:]].sum()) if predicted else 0
    return EvalResult(
        source=stream.source,
        tokenizer=stream.tokenizer,
        tokens=predicted,
        bytes=num_bytes,
        nats=math.fsum(nats),
        windows=len(wins),
        context_length=L,
        stride=L if stride is None else stride,
        batch_size=batch_size,
        seconds=time.perf_counter() - start,
    )
