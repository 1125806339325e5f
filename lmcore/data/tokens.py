"""Reading prepared token data: memmapped splits, batches of random windows, fixed eval batches.

    data = TokenData.open("data/stdlib")      # memmaps train.bin and val.bin, checks meta.json
    data.check(context_length=256, vocab_size=10_000)  # the model fits the data
    train = data.sampler("train", batch_size=32, context_length=256, seed=0, device="cuda")
    x, y = train.batch(step)                  # (32, 256) int64 each, y = x shifted by one
    for x, y in data.val_batches(batch_size=32, context_length=256, num_batches=20):
        ...                                   # the same windows at every evaluation

Chat data (`lmcore.data.chat`) has a loss mask beside each split: in its batches a target the
mask leaves out (a prompt's token) is `IGNORE` (`lmcore.model.nn.IGNORE`), which the loss skips; data
without one gives exactly the batches it always did.

`get_batch` is CS336's: `batch_size` random contiguous windows of `context_length + 1` tokens,
inputs and targets shifted by one. `BatchSampler.batch(step)` draws the same way from a
generator seeded by `(seed, step)` alone, so a batch is a pure function of the step: resuming
needs only the step, and no RNG state travels in a checkpoint. With `world_size` ranks every
rank draws the same global batch and keeps its own `batch_size // world_size` rows, so the
ranks' streams are disjoint and a run on N ranks sees exactly the batches of one process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from lmcore.data.meta import META_FILE, MIN_VOCAB, SPLITS, STARTS_DTYPE, DataMeta, file_dtype
from lmcore.errors import DataError, clip, did_you_mean, one_of

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Split = Literal["train", "val"]
Batch = tuple[Int[Tensor, "batch seq"], Int[Tensor, "batch seq"]]
_MAX_ID = {"uint16": 2**16, "uint32": 2**32}
# A target left out of the loss: `lmcore.model.nn.IGNORE`, which the loss reads (the model sits
# above the data, so the value is spelled here too; a test keeps them equal).
IGNORE = -100


def _inside(root: Path, name: str, field: str, fix: str) -> Path:
    """`root / name`, which must stay inside `root` after symbolic links are followed: the
    files of a data directory are its own, never a path that `meta.json` points elsewhere."""
    file = root / name
    real, home = os.path.realpath(file), os.path.realpath(root)
    if os.path.commonpath([real, home]) != home or real == home:
        raise DataError(
            f"{root / META_FILE}: {field} is {clip(name, 200)}, which resolves to "
            f"{clip(real, 200)}, outside the data directory {str(root)!r}; a data directory "
            f"holds its own files: {fix} --force"
        )
    return file


def _check_tokenizer(file: Path, meta: DataMeta, where: Path, fix: str) -> None:
    """The tokenizer's vocabulary must be the one `meta.json` states, <|endoftext|> included."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception for unparsable files
        raise DataError(
            f"{file}: is not a Hugging Face tokenizer.json ({e}); {fix} --force"
        ) from None
    size, eot = tok.get_vocab_size(), tok.token_to_id(meta.eot_token)
    if size != meta.vocab_size or eot != meta.eot_id:
        raise DataError(
            f"{where} says vocab_size {meta.vocab_size:,} with {meta.eot_token} = "
            f"{meta.eot_id}, but {file.name} has {size:,} tokens with {meta.eot_token} = {eot}: "
            f"the files do not belong together; {fix} --force"
        )


def _document_index(root: Path, name: str, meta: DataMeta, fix: str) -> np.ndarray:
    """Split `name`'s document index, checked against `meta.json` and the split's length:
    `starts` int64 offsets, the first 0, each one past the one before, all inside the split."""
    info = meta.splits[name]
    assert info.starts_file is not None and info.starts is not None  # meta.has_documents
    file = _inside(root, info.starts_file, f"splits.{name}.starts_file", fix)
    itemsize = np.dtype(STARTS_DTYPE).itemsize
    expected = info.starts * itemsize
    size = file.stat().st_size if file.is_file() else None
    if size != expected:
        found = "is missing" if size is None else f"holds {size:,} bytes"
        raise DataError(
            f"{file} {found}, but {META_FILE} says {info.starts:,} document starts × {itemsize} "
            f"bytes = {expected:,}: the files do not belong together (an interrupted or partial "
            f"copy); {fix} --force"
        )
    if not info.starts:
        starts = np.empty(0, dtype=STARTS_DTYPE)
    else:
        starts = np.memmap(file, dtype=STARTS_DTYPE, mode="r", shape=(info.starts,))
    # One pass over the index (8 bytes a document): a sampler trusts it to cut the split.
    ok = (len(starts) == 0) == (info.tokens == 0) and (
        len(starts) == 0
        or (starts[0] == 0 and starts[-1] < info.tokens and bool(np.all(np.diff(starts) > 0)))
    )
    if not ok:
        raise DataError(
            f"{file} is not a document index of {info.file} ({info.tokens:,} tokens): its offsets "
            f"must begin at 0, rise, and stay below the split's length; {fix} --force"
        )
    return starts


class TokenData:
    """A directory written by `prepare`: both splits as read-only memmaps, and the metadata."""

    def __init__(
        self,
        path: Path,
        meta: DataMeta,
        splits: dict[str, np.ndarray],
        masks: dict[str, np.ndarray] | None = None,
        documents: dict[str, np.ndarray] | None = None,
    ):
        self.path, self.meta, self._splits, self._documents = path, meta, splits, documents
        self._masks = masks or {}
        self._tokenizer: Tokenizer | None = None

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TokenData:
        """Memmap `train.bin` and `val.bin` of `path`, checked against its `meta.json`."""
        root = Path(path)
        fix = f"run: lmcore data prepare SOURCE... --out {root}"
        if not root.is_dir():
            raise DataError(f"data directory {str(root)!r} does not exist; {fix}")
        if not (root / META_FILE).is_file():
            partial = [p.name for p in sorted(root.glob("*.bin"))]
            why = (
                f"it holds {', '.join(partial)} but no {META_FILE}: an interrupted prepare, or "
                "files not written by lmcore"
                if partial
                else f"it has no {META_FILE}"
            )
            raise DataError(f"{str(root)!r} is not a prepared data directory: {why}; {fix} --force")
        meta = DataMeta.read(root / META_FILE)
        if meta.dtype not in _MAX_ID:
            raise DataError(f"{root / META_FILE}: dtype {meta.dtype!r} is not uint16 or uint32")
        if meta.vocab_size > _MAX_ID[meta.dtype]:
            raise DataError(
                f"{root / META_FILE}: vocab_size {meta.vocab_size:,} does not fit dtype "
                f"{meta.dtype} (at most {_MAX_ID[meta.dtype]:,} ids); {fix} --force"
            )
        if meta.eot_id >= meta.vocab_size:
            raise DataError(
                f"{root / META_FILE}: eot_id {meta.eot_id:,} is not an id of the vocabulary "
                f"(vocab_size {meta.vocab_size:,}: ids 0 to {meta.vocab_size - 1:,}); {fix} --force"
            )
        tokenizer = _inside(root, meta.tokenizer_file, "tokenizer_file", fix)
        if not tokenizer.is_file():
            raise DataError(f"{root / meta.tokenizer_file} is missing; {fix} --force")
        _check_tokenizer(tokenizer, meta, root / META_FILE, fix)
        dtype = file_dtype(meta.dtype)
        splits: dict[str, np.ndarray] = {}
        for name in SPLITS:
            info = meta.splits[name]
            file = _inside(root, info.file, f"splits.{name}.file", fix)
            expected = info.tokens * dtype.itemsize
            size = file.stat().st_size if file.is_file() else None
            if size != expected:
                found = "is missing" if size is None else f"holds {size:,} bytes"
                raise DataError(
                    f"{file} {found}, but {META_FILE} says {info.tokens:,} tokens × "
                    f"{dtype.itemsize} bytes = {expected:,}: the files do not belong together "
                    f"(an interrupted or partial copy); {fix} --force"
                )
            splits[name] = (
                np.memmap(file, dtype=dtype, mode="r", shape=(info.tokens,))
                if info.tokens
                else np.empty(0, dtype=dtype)
            )
        masks: dict[str, np.ndarray] = {}
        for name, mask in (meta.masks or {}).items():
            file = _inside(root, mask, f"masks.{name}", fix)
            size = file.stat().st_size if file.is_file() else None
            tokens = meta.splits[name].tokens
            if size != tokens:
                found = "is missing" if size is None else f"holds {size:,} bytes"
                raise DataError(
                    f"{file} {found}, but {META_FILE} says {tokens:,} tokens, one mask byte "
                    f"each: the files do not belong together; {fix} --force"
                )
            masks[name] = (
                np.memmap(file, dtype=np.uint8, mode="r", shape=(tokens,))
                if tokens
                else np.empty(0, dtype=np.uint8)
            )
        documents = None
        if meta.has_documents:
            documents = {name: _document_index(root, name, meta, fix) for name in SPLITS}
        return cls(root, meta, splits, masks, documents)

    @property
    def masked(self) -> bool:
        """Whether the data has loss masks (chat data): targets they leave out are `IGNORE`."""
        return bool(self._masks)

    def mask(self, name: str) -> np.ndarray | None:
        """Split `name`'s loss mask (uint8, 1: a trained target), None when it has none."""
        self.split(name)  # checks the name
        return self._masks.get(name)

    @property
    def documents(self) -> dict[str, np.ndarray] | None:
        """Each split's document index (`lmcore.data.meta.STARTS_RULE`): the offsets of its
        documents' first tokens, int64, ascending, 0 first; None for a directory prepared
        before lmcore recorded them."""
        return self._documents

    def document_starts(self, name: str, option: str) -> np.ndarray:
        """Split `name`'s document index, which `option` needs: a `DataError` naming this
        directory and how to prepare it again when it has none."""
        if self._documents is None:
            raise DataError(
                f"{option} needs the document index of the data, but {self.path} has none (it "
                f"was prepared before lmcore recorded where documents start); prepare it again: "
                f"lmcore data prepare SOURCE... --out {self.path} --force"
            )
        self.split(name)  # names a split that is not one
        return self._documents[name]

    @property
    def vocab_size(self) -> int:
        return self.meta.vocab_size

    @property
    def eot_id(self) -> int:
        return self.meta.eot_id

    @property
    def train(self) -> np.ndarray:
        return self._splits["train"]

    @property
    def val(self) -> np.ndarray:
        return self._splits["val"]

    def split(self, name: str) -> np.ndarray:
        """The token ids of split `name` (`train` or `val`), a read-only memmap."""
        if name not in self._splits:
            raise DataError(
                f"no split {name!r}{did_you_mean(name, SPLITS)}; the splits are {one_of(SPLITS)}"
            )
        return self._splits[name]

    def _where(self, name: str) -> str:
        return f"{self.meta.splits[name].file} of {self.path}"

    def check(self, *, context_length: int, vocab_size: int | None = None) -> None:
        """Raise `DataError` unless each split holds a window of `context_length + 1` tokens
        and, when given, a model's `vocab_size` covers every id of this data."""
        for name in SPLITS:
            need_window(len(self._splits[name]), context_length, self._where(name))
        if vocab_size is not None and vocab_size < self.vocab_size:
            other = (
                f"or prepare the data with --vocab-size {vocab_size}"
                if vocab_size >= MIN_VOCAB
                else f"(a prepared vocabulary has at least {MIN_VOCAB} tokens: the 256 bytes and "
                f"{self.meta.eot_token})"
            )
            raise DataError(
                f"the model's vocab_size={vocab_size:,} is smaller than the data's "
                f"{self.vocab_size:,} tokens ({self.path / self.meta.tokenizer_file}), so ids "
                f"≥ {vocab_size:,} would be out of range; use vocab_size={self.vocab_size} in the "
                f'spec (e.g. "tinystories, vocab_size={self.vocab_size}") {other}'
            )

    def sampler(
        self,
        split: Split = "train",
        *,
        batch_size: int,
        context_length: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> BatchSampler:
        """Random windows of `split`: batch `step` is a pure function of `(seed, step)`."""
        return BatchSampler(
            self.split(split),
            batch_size=batch_size,
            context_length=context_length,
            seed=seed,
            rank=rank,
            world_size=world_size,
            device=device,
            where=self._where(split),
            mask=self.mask(split),
        )

    def val_batches(
        self,
        *,
        batch_size: int,
        context_length: int,
        num_batches: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> EvalBatches:
        """A fixed set of validation batches: the same windows at every evaluation."""
        return EvalBatches(
            self.val,
            batch_size=batch_size,
            context_length=context_length,
            num_batches=num_batches,
            rank=rank,
            world_size=world_size,
            device=device,
            where=self._where("val"),
            mask=self.mask("val"),
        )

    def tokenizer(self) -> Tokenizer:
        """The Hugging Face tokenizer that produced the ids (loaded on first use)."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(self.path / self.meta.tokenizer_file))
        return self._tokenizer

    def decode(self, ids: np.ndarray | Tensor | list[int]) -> str:
        """Text of token ids; <|endoftext|> is kept, so documents stay visible."""
        if isinstance(ids, Tensor):
            ids = ids.detach().cpu().numpy()
        flat: list[int] = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        return self.tokenizer().decode(flat, skip_special_tokens=False)

    def __repr__(self) -> str:
        t, v = (self.meta.splits[s].tokens for s in SPLITS)
        return (
            f"TokenData({str(self.path)!r}: train {t:,} + val {v:,} tokens, "
            f"vocab {self.vocab_size:,}, {self.meta.dtype})"
        )


# --- windows -------------------------------------------------------------------------------


def need_window(tokens: int, context_length: int, where: str = "the token array") -> None:
    """Raise unless `tokens` ids hold one window of `context_length + 1`."""
    if context_length < 1:
        raise DataError(f"context_length must be at least 1, got {context_length}")
    if tokens < context_length + 1:
        raise DataError(
            f"{where} holds {tokens:,} tokens, fewer than one window of context_length + 1 = "
            f"{context_length + 1:,}; use a shorter context_length, or prepare the data with "
            "more text (or a larger --val-fraction for val.bin)"
        )


def _check_batch(batch_size: int, rank: int, world_size: int) -> None:
    if batch_size < 1:
        raise DataError(f"batch_size must be at least 1, got {batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is not in 0..world_size-1 (world_size {world_size})")
    if batch_size % world_size:
        raise DataError(
            f"batch_size {batch_size} (the global batch) is not divisible by world_size "
            f"{world_size}; use a multiple of {world_size}, e.g. "
            f"{(batch_size // world_size + 1) * world_size}"
        )


def window_starts(
    tokens: int, batch_size: int, context_length: int, generator: torch.Generator | None = None
) -> np.ndarray:
    """`batch_size` uniform random starts in `[0, tokens - context_length - 1]` (int64)."""
    high = tokens - context_length  # exclusive: the last window ends at the last token
    return torch.randint(0, high, (batch_size,), generator=generator).numpy()


def windows(
    tokens: np.ndarray,
    starts: np.ndarray,
    context_length: int,
    device: str | torch.device,
    mask: np.ndarray | None = None,
) -> Batch:
    """Inputs `tokens[s : s + T]` and targets `tokens[s + 1 : s + T + 1]` for each start, as
    int64 on `device` (through pinned memory to CUDA, without blocking). With a loss `mask`
    (uint8 beside `tokens`, 1: trained) a target whose mask is 0 is `IGNORE`."""
    index = starts[:, None] + np.arange(context_length + 1)  # (B, T + 1)
    rows = np.asarray(tokens[index], dtype=np.int64)  # reads only these windows of a memmap
    x = torch.from_numpy(np.ascontiguousarray(rows[:, :-1]))  # (B, T)
    targets = rows[:, 1:]
    if mask is not None:
        targets = np.where(np.asarray(mask[index[:, 1:]]) != 0, targets, IGNORE)
    y = torch.from_numpy(np.ascontiguousarray(targets))  # (B, T)
    dev = torch.device(device)
    if dev.type == "cuda":
        return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
    return x.to(dev), y.to(dev)


def get_batch(
    dataset: np.ndarray,
    batch_size: int,
    context_length: int,
    device: str | torch.device = "cpu",
    *,
    generator: torch.Generator | None = None,
) -> Batch:
    """CS336's `get_batch`: `batch_size` random windows of `dataset` (a 1-D array of ids, e.g.
    a memmap), as `(inputs, targets)` int64 tensors of shape `(batch_size, context_length)` on
    `device`. `generator` (CPU) makes the draw reproducible; None uses torch's global one."""
    _check_batch(batch_size, 0, 1)
    need_window(len(dataset), context_length)
    starts = window_starts(len(dataset), batch_size, context_length, generator)
    return windows(dataset, starts, context_length, device)


def _checked_mask(tokens: np.ndarray, mask: np.ndarray | None) -> np.ndarray | None:
    if mask is not None and len(mask) != len(tokens):
        raise DataError(f"the loss mask holds {len(mask):,} entries for {len(tokens):,} tokens")
    return mask


def step_seed(seed: int, step: int) -> int:
    """The seed of batch `step` of stream `seed`: numpy's SeedSequence hash of the pair, so
    nearby seeds and steps give unrelated generators."""
    if seed < 0 or step < 0:
        raise DataError(f"seed and step must be ≥ 0, got seed={seed}, step={step}")
    hi, lo = np.random.SeedSequence([seed, step]).generate_state(2, np.uint32)
    return ((int(hi) << 32) | int(lo)) & (2**63 - 1)


class BatchSampler:
    """Batches of random windows, batch `step` a pure function of `(seed, step)`.

    `batch_size` is the global batch. Each call draws `batch_size` window starts from a CPU
    generator seeded with `step_seed(seed, step)` and returns rows
    `[rank * b, (rank + 1) * b)` of it, `b = batch_size // world_size`: on one process all of
    them (CS336's `get_batch` with that generator), on N ranks disjoint slices whose union is
    the one-process batch.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        batch_size: int,
        context_length: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        where: str = "the token array",
        mask: np.ndarray | None = None,
    ):
        _check_batch(batch_size, rank, world_size)
        need_window(len(tokens), context_length, where)
        step_seed(seed, 0)  # checks the seed
        self.mask = _checked_mask(tokens, mask)
        self.tokens, self.batch_size, self.context_length = tokens, batch_size, context_length
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.device = torch.device(device)
        per_rank = batch_size // world_size
        self.rows = slice(rank * per_rank, (rank + 1) * per_rank)

    def starts(self, step: int) -> np.ndarray:
        """This rank's window starts of batch `step`."""
        g = torch.Generator().manual_seed(step_seed(self.seed, step))
        return window_starts(len(self.tokens), self.batch_size, self.context_length, g)[self.rows]

    def batch(self, step: int) -> Batch:
        """`(inputs, targets)`, each `(batch_size // world_size, context_length)` int64."""
        return windows(self.tokens, self.starts(step), self.context_length, self.device, self.mask)

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate()

    def iterate(self, start: int = 0) -> Iterator[Batch]:
        """Batches `start`, `start + 1`, ... without end (resume from a saved step)."""
        step = start
        while True:
            yield self.batch(step)
            step += 1


class EvalBatches:
    """A fixed set of evaluation windows, cut into equal batches.

    `num_batches * batch_size` windows with evenly spaced starts, from the first token to the
    last window that fits; by default as many batches as non-overlapping windows allow (at
    least one), which covers the split once. Every batch is full, so the mean of the batch
    losses is the mean over all windows. Ranks take disjoint row slices, as `BatchSampler`.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        batch_size: int,
        context_length: int,
        num_batches: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        where: str = "the token array",
        mask: np.ndarray | None = None,
    ):
        _check_batch(batch_size, rank, world_size)
        need_window(len(tokens), context_length, where)
        self.mask = _checked_mask(tokens, mask)
        if num_batches is not None and num_batches < 1:
            raise DataError(f"num_batches must be at least 1, got {num_batches}")
        last = len(tokens) - context_length - 1  # the last start that fits
        fit = (len(tokens) - 1) // context_length  # non-overlapping windows
        count = num_batches if num_batches is not None else max(1, fit // batch_size)
        n = count * batch_size
        # Integer spacing: starts never step back, and are ≥ context_length apart when `n`
        # windows fit without overlap.
        self._starts = (np.arange(n, dtype=np.int64) * last) // max(n - 1, 1)
        self.tokens, self.batch_size, self.context_length = tokens, batch_size, context_length
        self.device = torch.device(device)
        per_rank = batch_size // world_size
        self.rows = slice(rank * per_rank, (rank + 1) * per_rank)

    def __len__(self) -> int:
        return len(self._starts) // self.batch_size

    def starts(self, index: int) -> np.ndarray:
        """This rank's window starts of batch `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"evaluation batch {index} of {len(self)}")
        batch = self._starts[index * self.batch_size : (index + 1) * self.batch_size]
        return batch[self.rows]

    def __getitem__(self, index: int) -> Batch:
        return windows(
            self.tokens, self.starts(index), self.context_length, self.device, self.mask
        )

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(len(self)))

    @property
    def masked(self) -> bool:
        """Whether targets may be `IGNORE` (a loss mask): the batches then hold unequal numbers
        of kept targets, and a mean over them weighs each batch by its count."""
        return self.mask is not None

    @property
    def predicted_tokens(self) -> int:
        """Targets in all batches, every rank together."""
        return len(self._starts) * self.context_length
