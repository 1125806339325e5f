"""Gradient accumulation (`--micro-batch B`): one update from the gradients of several
micro-batches, the whole batch's.

    n = micro_steps(batch_size=32, micro_batch=8, world_size=2)   # 4 micro-batches a step
    for i, (x, y, _) in enumerate(micro_batches(xs, ys, n)):       # this rank's rows, in order
        with parallel.no_sync(model) if i < n - 1 else nullcontext():
            backward(scaled(cross_entropy(model(x), y), n))

Every micro-batch has as many sequences of the same length, so the batch's mean loss is the
mean of the micro-batches' means, and its gradient the sum of theirs each scaled by 1/n: the
update equals the whole batch's up to float rounding. Under DDP or FSDP the gradients are
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


def scaled(loss: Tensor, n: int) -> Tensor:
    """`loss / n`, what one of `n` micro-batches contributes; `loss` itself when n is 1."""
    return loss if n == 1 else loss / n


def mean_of(values: list[Tensor]) -> Tensor:
    """The mean of equal-weight scalars (the micro-batches' losses); the one itself for one."""
    return values[0] if len(values) == 1 else torch.stack(values).mean()
