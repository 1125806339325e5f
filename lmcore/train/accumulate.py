"""Gradient accumulation (`--micro-batch B`): one update from the gradients of several
micro-batches, the whole batch's.

    n = micro_steps(batch_size=32, micro_batch=8, world_size=2)   # 4 micro-batches a step
    w = micro_weights(ys, n)                                       # their shares of the batch
    for i, (x, y, _) in enumerate(micro_batches(xs, ys, n)):       # this rank's rows, in order
        with parallel.no_sync(model) if i < n - 1 else nullcontext():
            backward(cross_entropy(model(x), y) * w[i])

A micro-batch's loss is the mean over its kept targets (those not `IGNORE`), so the batch's
mean loss is the micro-batches' means weighted by their shares of the kept targets (1/n each
without a loss mask), and its gradient the sum of theirs weighted alike: the update equals the
whole batch's up to float rounding. Under DDP or FSDP the gradients are
synchronised once, in the last micro-batch's backward (`Parallel.no_sync` before it). Each
micro-batch's auxiliary loss (a mixture of experts' load balancing) is scaled alike, and the
step's is their mean: it is a function of each micro-batch's routing, as it would be of each
rank's under DDP.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from lmcore.errors import TrainError
from lmcore.model.nn import IGNORE

__all__ = ["mean_of", "micro_batches", "micro_steps", "scaled"]


def micro_steps(batch_size: int, micro_batch: int | None, world_size: int = 1) -> int:
    """Micro-batches per step: `batch_size / micro_batch` (1 without one). `TrainError` when
    `micro_batch` (all processes together) does not divide `batch_size` or split evenly over
    `world_size` processes."""
    if micro_batch is None:
        return 1
    if micro_batch < 1 or batch_size % micro_batch:
        raise TrainError(
            f"--micro-batch {micro_batch}: must be a divisor of --batch-size {batch_size}"
        )
    if micro_batch % world_size:
        raise TrainError(
            f"--micro-batch {micro_batch} does not split over {world_size} processes (each "
            f"takes an equal share of every micro-batch); use a multiple of {world_size}"
        )
    return batch_size // micro_batch


def micro_batches(
    x: Tensor, y: Tensor, n: int, documents: Tensor | None = None
) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
    """The `n` equal consecutive slices of the rows of the inputs `x`, targets `y` and document
    ids `documents` (None: None in every slice)."""
    if x.shape[0] % n:
        raise TrainError(f"a batch of {x.shape[0]} rows does not split into {n} micro-batches")
    size = x.shape[0] // n
    for i in range(n):
        rows = slice(i * size, (i + 1) * size)
        yield x[rows], y[rows], None if documents is None else documents[rows]


def micro_weights(y: Tensor, n: int) -> Tensor | None:
    """Each of `n` micro-batches' share of the batch's kept targets (those not `IGNORE`): a
    micro-batch's loss is the mean over its own kept targets, so these weights make the sum the
    whole batch's mean when a loss mask keeps more in one than in another; None for one."""
    if n == 1:
        return None
    kept = (y != IGNORE).reshape(n, -1).sum(dim=1).to(torch.float32)
    return kept / kept.sum().clamp_min(1)  # all ignored: zero weights, zero loss, no NaN


def weighted(values: list[Tensor], weights: Tensor | None) -> Tensor:
    """The batch's value from its micro-batches': the one itself for one, else the weighted sum."""
    if weights is None:
        return values[0]
    return (torch.stack(values) * weights.to(values[0].device)).sum()
