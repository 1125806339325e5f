"""Batches that know documents: windows with document ids, and rows packed with whole documents.

    data = TokenData.open("data/stdlib")
    packed = packed_sampler(data, "train", batch_size=32, context_length=256, seed=0,
                            mask_boundaries=True)
    x, y, documents = packed.batch(step)   # (32, 256) int64 each; documents 0 0 0 1 1 2 ...
    packed.packing.efficiency             # document tokens / row capacity (the rest: padding)
    windows = document_sampler(data, "train", batch_size=32, context_length=256, seed=0)
    x, y, documents = windows.batch(step)  # today's windows, with their document ids

Both need the data's document index (`TokenData.document_starts`, `lmcore.data.meta.STARTS_RULE`).

**Document ids.** `documents[b, t]` numbers the documents of row `b` from 0 at its first token,
rising by one at each document's first token: equal ids are one document, and the ids never
fall along a row (the model's `documents=`: block-causal attention, positions restarting).

**Packing** (`pack`). A row holds `context_length + 1` tokens (inputs are its first
`context_length`, targets its last). A document of `L` tokens (`L ≥ 2`) is cut into pieces of
at most `context_length + 1` tokens that start `context_length` apart: consecutive pieces share
one token, the last target of one being the first input of the next, so every prediction inside
a document (token `i` predicting token `i + 1`) lies in exactly one piece. A piece of the full
length is a row by itself; the shorter ones (each document's last, or only, piece) are packed
into rows by best-fit decreasing (the longest first, each into the open row it fills most
tightly), and what a row has left over is padding. Every row therefore begins at the first
token of a piece (a document's first token, or where a long document's next piece begins) and
holds whole pieces; a document's pieces keep its order.
The packing depends on the data and `context_length` alone; each epoch (one pass over every
row) visits the rows in its own order, a permutation drawn from `(seed, epoch)`, and batch
`step` takes rows `step · batch_size ...` of that sequence: a pure function of `(seed, step)`,
so a resumed run draws the same batches bit for bit, and every in-document prediction of the
split is trained once per epoch. Documents of one token (nothing to predict inside them) are
left out.

**Targets.** Padding: input `<|endoftext|>`, target `IGNORE` (left out of the loss), and a
document id of its own (one past the row's last document). With `mask_boundaries` (the
trainer's `--doc-mask`) the target of each document's last token, which is the next
document's first token, is `IGNORE` as well: under document masking a token sees only its own
document, so nothing there can predict what follows it. Without it those targets stay, as in
one stream (after `<|endoftext|>` comes some document's first token). Chat data's loss mask
(`lmcore.data.chat`) applies as in today's batches: a target it leaves out is `IGNORE` too; its
document index is its conversations' starts.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from lmcore.data.tokens import (
    IGNORE,
    BatchSampler,
    EvalBatches,
    Split,
    TokenData,
    _check_batch,
    need_window,
    step_seed,
)
from lmcore.errors import DataError

__all__ = [
    "IGNORE",
    "DocumentBatch",
    "DocumentEvalBatches",
    "DocumentSampler",
    "PackedSampler",
    "Packing",
    "document_ids",
    "document_sampler",
    "document_val_batches",
    "pack",
    "packed_sampler",
    "packing_of",
]

DocumentBatch = tuple[Int[Tensor, "batch seq"], Int[Tensor, "batch seq"], Int[Tensor, "batch seq"]]


# ------------------------------------------------------------------------------ windows


def document_ids(starts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The document ids of `positions` (rows of offsets into a split, each ascending): for
    each row, how many documents of the index `starts` begin after its first position and at
    or before each one. 0 at every row's first position."""
    index = np.searchsorted(starts, positions, side="right") - 1
    ids: np.ndarray = index - index[..., :1]
    return ids


def _to_device(device: torch.device, *arrays: np.ndarray) -> DocumentBatch:
    tensors = [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in arrays]
    if device.type == "cuda":
        tensors = [t.pin_memory().to(device, non_blocking=True) for t in tensors]
    else:
        tensors = [t.to(device) for t in tensors]
    x, y, d = tensors
    return x, y, d


def _documents_of(
    w: BatchSampler | EvalBatches, starts: np.ndarray, windows: np.ndarray,
    mask_boundaries: bool,
) -> DocumentBatch:  # fmt: skip
    """Inputs, targets and document ids of `w`'s windows beginning at `windows` (a target its
    loss mask leaves out, chat data's prompt, is `IGNORE` as in `w`'s own batches)."""
    index = windows[:, None] + np.arange(w.context_length + 1)  # (B, T + 1)
    rows = np.asarray(w.tokens[index], dtype=np.int64)
    ids = document_ids(starts, index)
    targets = rows[:, 1:].copy()
    if w.mask is not None:
        targets[np.asarray(w.mask[index[:, 1:]]) == 0] = IGNORE
    if mask_boundaries:
        targets[ids[:, 1:] != ids[:, :-1]] = IGNORE
    return _to_device(w.device, rows[:, :-1], targets, ids[:, :-1])


class DocumentSampler:
    """`BatchSampler`'s windows (the same rows, bit for bit), with their document ids:
    `batch(step)` is `(inputs, targets, documents)`; with `mask_boundaries` the targets that
    cross into the next document are `IGNORE`."""

    def __init__(self, windows: BatchSampler, starts: np.ndarray, *, mask_boundaries: bool):
        self.windows, self.starts, self.mask_boundaries = windows, starts, mask_boundaries

    def batch(self, step: int) -> DocumentBatch:
        return _documents_of(self.windows, self.starts, self.windows.starts(step),
                             self.mask_boundaries)  # fmt: skip

    def __iter__(self) -> Iterator[DocumentBatch]:
        return self.iterate()

    def iterate(self, start: int = 0) -> Iterator[DocumentBatch]:
        step = start
        while True:
            yield self.batch(step)
            step += 1


class DocumentEvalBatches:
    """`EvalBatches`' fixed windows with their document ids, as `DocumentSampler`."""

    def __init__(self, windows: EvalBatches, starts: np.ndarray, *, mask_boundaries: bool):
        self.windows, self.starts, self.mask_boundaries = windows, starts, mask_boundaries

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> DocumentBatch:
        return _documents_of(self.windows, self.starts, self.windows.starts(index),
                             self.mask_boundaries)  # fmt: skip

    @property
    def masked(self) -> bool:
        """Whether targets may be `IGNORE` (the evaluation then weighs each batch by its kept
        targets, as for a loss mask)."""
        return self.mask_boundaries or self.windows.masked

    def __iter__(self) -> Iterator[DocumentBatch]:
        return (self[i] for i in range(len(self)))


# ------------------------------------------------------------------------------ packing


@dataclass(frozen=True)
class Packing:
    """Pieces of a split's documents in rows of `length` tokens: row `r` holds pieces
    `row_ptr[r]:row_ptr[r + 1]`, piece `p` being tokens `[start[p], start[p] + size[p])`."""

    length: int  # tokens a row holds: context_length + 1
    start: np.ndarray  # int64, each piece's offset into the split
    size: np.ndarray  # int64, each piece's tokens (2 .. length)
    row_ptr: np.ndarray  # int64, rows + 1 entries
    opens: np.ndarray  # bool, each piece begins its document
    documents: int  # documents packed (those of at least 2 tokens)
    split: int  # of them, cut into more than one piece

    @property
    def rows(self) -> int:
        return len(self.row_ptr) - 1

    @property
    def tokens(self) -> int:
        """Document tokens in all rows (a token two pieces share counts twice)."""
        return int(self.size.sum())

    @property
    def efficiency(self) -> float:
        """Document tokens / row capacity: the share of the rows that is not padding."""
        return self.tokens / max(self.rows * self.length, 1)

    @property
    def aligned(self) -> float:
        """The share of rows that begin at a document's first token (the others begin at a
        later piece of a long document)."""
        return float(self.opens[self.row_ptr[:-1]].mean()) if self.rows else 0.0

    @property
    def predictions(self) -> int:
        """Targets inside documents, those `--doc-mask` trains: one fewer than each piece's
        tokens."""
        return self.tokens - len(self.size)

    def summary(self) -> str:
        """One line for `lmcore train`'s header."""
        T = self.length - 1
        return (
            f"packing: {self.documents:,} documents ({self.split:,} longer than a row, cut into "
            f"pieces) in {self.rows:,} rows of {T:,} + 1 tokens: {self.efficiency:.2%} document "
            f"tokens, the rest padding; {self.aligned:.1%} of the rows begin at a document's "
            "first token, the others at a piece of a long one"
        )


def pack(starts: np.ndarray, tokens: int, context_length: int) -> Packing:
    """Pack the documents that begin at `starts` in a split of `tokens` tokens into rows of
    `context_length + 1` (see the module's docstring)."""
    if context_length < 1:
        raise DataError(f"context_length must be at least 1, got {context_length}")
    T, length = context_length, context_length + 1
    begin = np.asarray(starts, dtype=np.int64)
    sizes = np.diff(np.append(begin, tokens))
    keep = sizes >= 2
    begin, sizes = begin[keep], sizes[keep]
    if len(begin) == 0:
        raise DataError(
            f"no document of the split holds 2 tokens or more ({len(starts):,} documents, "
            f"{tokens:,} tokens): there is nothing to pack"
        )
    # Pieces start T apart and hold up to T + 1 tokens: n_full full ones, then the rest.
    full = (sizes - 1) // T
    rest = (sizes - 1) % T  # predictions left for a last, shorter piece (0: none)
    doc = np.repeat(np.arange(len(begin)), full)
    within = np.arange(len(doc)) - np.repeat(np.cumsum(full) - full, full)
    full_start = begin[doc] + within * T
    has_rest = rest > 0
    rest_start = begin[has_rest] + full[has_rest] * T
    rest_size = rest[has_rest] + 1
    # Full pieces are rows of their own; the rest are packed by best-fit decreasing.
    row_of, order, rows = _best_fit_decreasing(rest_size, length)
    start = np.concatenate([full_start, rest_start[order]])
    size = np.concatenate([np.full(len(full_start), length, dtype=np.int64), rest_size[order]])
    opens = np.concatenate([within == 0, (full[has_rest] == 0)[order]])
    counts = np.concatenate([np.ones(len(full_start), dtype=np.int64),
                             np.bincount(row_of, minlength=rows)])  # fmt: skip
    row_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    split = int(np.count_nonzero(full + has_rest > 1))
    return Packing(length, start.astype(np.int64), size.astype(np.int64), row_ptr, opens,
                   documents=len(begin), split=split)  # fmt: skip


def _best_fit_decreasing(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Place items (each ≤ `capacity`) into rows, the largest first, each into the open row
    with the least room that holds it (a new row when none does). Returns each item's row, the
    items ordered by row and, within a row, as placed, and the rows used. Ties go in a stable
    sort's order, so the result depends on `sizes` alone."""
    row_of = np.empty(len(sizes), dtype=np.int64)
    free: list[list[int]] = [[] for _ in range(capacity + 1)]  # free[r]: open rows with r left
    has = np.zeros(capacity + 1, dtype=bool)  # free[r] is not empty
    smallest = int(sizes.min()) if len(sizes) else capacity
    rows = 0
    placing = np.argsort(-sizes, kind="stable")
    for i in placing.tolist():
        s = int(sizes[i])
        room = s + int(np.argmax(has[s:]))  # the least room ≥ s among open rows, if any
        if has[room]:
            row = free[room].pop()
            has[room] = bool(free[room])
        else:
            row, room = rows, capacity
            rows += 1
        row_of[i] = row
        left = room - s
        if left >= smallest:  # a row with less room than the smallest item takes no more
            free[left].append(row)
            has[left] = True
    order = placing[np.argsort(row_of[placing], kind="stable")]
    return row_of, order, rows


class PackedSampler:
    """Batches of packed rows, batch `step` a pure function of `(seed, step)`: the rows
    `step · batch_size ... (step + 1) · batch_size - 1` of the sequence in which epoch after
    epoch visits every row of `packing` in an order drawn from `(seed, epoch)`. `batch_size` is
    the global batch; rank `rank` of `world_size` takes its rows `[rank · b, (rank + 1) · b)`,
    `b = batch_size // world_size`, as `BatchSampler`. Yields `(inputs, targets, documents)`."""

    def __init__(
        self,
        tokens: np.ndarray,
        packing: Packing,
        *,
        batch_size: int,
        eot_id: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        mask_boundaries: bool = False,
        loss_mask: np.ndarray | None = None,
        device: str | torch.device = "cpu",
    ):
        _check_batch(batch_size, rank, world_size)
        step_seed(seed, 0)  # checks the seed
        self.tokens, self.packing, self.eot_id = tokens, packing, eot_id
        self.batch_size = batch_size
        self.seed, self.mask_boundaries, self.loss_mask = seed, mask_boundaries, loss_mask
        self.context_length = packing.length - 1
        self.device = torch.device(device)
        per_rank = batch_size // world_size
        self.rows = slice(rank * per_rank, (rank + 1) * per_rank)
        self._orders: dict[int, np.ndarray] = {}  # the last epochs' row orders

    def order(self, epoch: int) -> np.ndarray:
        """The order in which epoch `epoch` visits the rows: a permutation from `(seed, epoch)`."""
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(step_seed(self.seed, epoch))
            if len(self._orders) >= 2:  # a batch spans at most two epochs (batch ≤ rows) or
                self._orders.pop(min(self._orders))  # recomputes: the result is the same
            self._orders[epoch] = torch.randperm(self.packing.rows, generator=g).numpy()
        return self._orders[epoch]

    def row_indices(self, step: int) -> np.ndarray:
        """This rank's rows of batch `step` (indices into `packing`)."""
        if step < 0:
            raise DataError(f"step must be ≥ 0, got {step}")
        n = self.packing.rows
        g = step * self.batch_size + np.arange(self.batch_size, dtype=np.int64)[self.rows]
        return np.array([self.order(int(e))[int(i)] for e, i in zip(g // n, g % n, strict=True)],
                        dtype=np.int64)  # fmt: skip

    def batch(self, step: int) -> DocumentBatch:
        """`(inputs, targets, documents)`, each `(batch_size // world_size, context_length)`."""
        p, length = self.packing, self.packing.length
        picked = self.row_indices(step)
        rows = np.full((len(picked), length), self.eot_id, dtype=np.int64)
        ids = np.empty((len(picked), length), dtype=np.int64)
        real = np.zeros((len(picked), length), dtype=bool)  # a document's token, not padding
        for b, r in enumerate(picked.tolist()):
            at = 0
            for k, piece in enumerate(range(int(p.row_ptr[r]), int(p.row_ptr[r + 1]))):
                s, n = int(p.start[piece]), int(p.size[piece])
                rows[b, at : at + n] = self.tokens[s : s + n]
                if self.loss_mask is not None:  # chat data: the prompt's targets left out
                    real[b, at : at + n] = np.asarray(self.loss_mask[s : s + n]) != 0
                else:
                    real[b, at : at + n] = True
                ids[b, at : at + n] = k
                at += n
            ids[b, at:] = int(p.row_ptr[r + 1] - p.row_ptr[r])  # padding: a document of its own
        targets = rows[:, 1:].copy()
        targets[~real[:, 1:]] = IGNORE
        if self.mask_boundaries:
            targets[ids[:, 1:] != ids[:, :-1]] = IGNORE
        return _to_device(self.device, rows[:, :-1], targets, ids[:, :-1])

    def __iter__(self) -> Iterator[DocumentBatch]:
        return self.iterate()

    def iterate(self, start: int = 0) -> Iterator[DocumentBatch]:
        """Batches `start`, `start + 1`, ... without end (resume from a saved step)."""
        step = start
        while True:
            yield self.batch(step)
            step += 1


# ------------------------------------------------------------------------------ of TokenData

# Each open TokenData's packings, by (split, context_length): computed once, gone with it.
_PACKINGS: weakref.WeakKeyDictionary[TokenData, dict[tuple[str, int], Packing]] = (
    weakref.WeakKeyDictionary()
)


def packing_of(data: TokenData, split: Split, context_length: int) -> Packing:
    """Split `split` of `data` packed into rows of `context_length + 1` tokens (`pack`),
    computed once per data, split and length; a `DataError` for data with no document index."""
    packings = _PACKINGS.setdefault(data, {})
    key = (split, context_length)
    if key not in packings:
        tokens = data.split(split)
        starts = data.document_starts(split, "packed batches")
        need_window(len(tokens), context_length, f"{data.meta.splits[split].file} of {data.path}")
        packings[key] = pack(starts, len(tokens), context_length)
    return packings[key]


def packed_sampler(
    data: TokenData,
    split: Split = "train",
    *,
    batch_size: int,
    context_length: int,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    mask_boundaries: bool = False,
    device: str | torch.device = "cpu",
) -> PackedSampler:
    """Rows of split `split` packed with whole documents: batch `step` is `(inputs, targets,
    documents)`, a pure function of `(seed, step)`."""
    return PackedSampler(
        data.split(split),
        packing_of(data, split, context_length),
        batch_size=batch_size,
        eot_id=data.eot_id,
        seed=seed,
        rank=rank,
        world_size=world_size,
        mask_boundaries=mask_boundaries,
        loss_mask=data.mask(split),
        device=device,
    )


def document_sampler(
    data: TokenData,
    split: Split = "train",
    *,
    batch_size: int,
    context_length: int,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    mask_boundaries: bool = False,
    device: str | torch.device = "cpu",
) -> DocumentSampler:
    """`data.sampler`'s windows with their document ids: `(inputs, targets, documents)`."""
    starts = data.document_starts(split, "document ids")
    windows = data.sampler(split, batch_size=batch_size, context_length=context_length,
                           seed=seed, rank=rank, world_size=world_size, device=device)  # fmt: skip
    return DocumentSampler(windows, starts, mask_boundaries=mask_boundaries)


def document_val_batches(
    data: TokenData,
    *,
    batch_size: int,
    context_length: int,
    num_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    mask_boundaries: bool = False,
    device: str | torch.device = "cpu",
) -> DocumentEvalBatches:
    """`data.val_batches`' fixed windows with their document ids."""
    starts = data.document_starts("val", "document ids")
    windows = data.val_batches(batch_size=batch_size, context_length=context_length,
                               num_batches=num_batches, rank=rank, world_size=world_size,
                               device=device)  # fmt: skip
    return DocumentEvalBatches(windows, starts, mask_boundaries=mask_boundaries)
