"""Checks of what a model is given: token ids and positions, before they reach any index.

Bad input raises `ModelInputError` (a `ValueError`) or `ModelInputTypeError` (a `TypeError`)
naming the value, where it is and what is allowed, never an opaque index error deep inside.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from lmcore.errors import ModelInputError, ModelInputTypeError


def check_ids(ids: object, *, vocab_size: int, context_length: int) -> Int[Tensor, "... T"]:
    """`ids` as given, once it is an integer tensor `(..., T)` with `1 <= T <= context_length`
    and every value in `0..vocab_size-1`."""
    if not isinstance(ids, Tensor):
        raise ModelInputTypeError(f"token ids must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ModelInputTypeError(
            f"token ids must be an integer tensor, got dtype {ids.dtype}; convert with ids.long()"
        )
    if ids.ndim == 0:
        raise ModelInputError("token ids need a sequence dimension: shape (..., seq)")
    seq = ids.shape[-1]
    if seq > context_length:
        raise ModelInputError(
            f"sequence length {seq} exceeds context_length={context_length}; truncate to the "
            f"last {context_length} tokens or build with a larger context_length"
        )
    if seq == 0:
        raise ModelInputError("token ids have an empty sequence dimension")
    if values_checkable(ids):
        bad = (ids < 0) | (ids >= vocab_size)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0])
            raise ModelInputError(
                f"token id {int(ids[where])} at index {where} is out of range for "
                f"vocab_size={vocab_size} (valid ids: 0..{vocab_size - 1})"
            )
    return ids


def check_positions(
    token_positions: Tensor | None, ids: Int[Tensor, "B T"], *, context_length: int
) -> Int[Tensor, "B_or_1 T"]:
    """The `(B or 1, T)` positions of `ids`: `arange(T)` when none are given, else the given
    ones once they are integers in `0..context_length-1` with one row or one per sequence."""
    seq = ids.shape[-1]
    if token_positions is None:
        return torch.arange(seq, device=ids.device)[None, :]  # (1, T)
    pos = token_positions
    if pos.dtype.is_floating_point or pos.dtype == torch.bool or pos.shape[-1] != seq:
        raise ModelInputError(
            f"token_positions must be integers of shape (..., {seq}); "
            f"got dtype {pos.dtype}, shape {tuple(pos.shape)}"
        )
    pos = pos.reshape(-1, seq)
    if pos.shape[0] not in (1, ids.shape[0]):
        raise ModelInputError(
            f"token_positions has {pos.shape[0]} rows for a batch of {ids.shape[0]}"
        )
    ctx = context_length
    if values_checkable(pos) and bool(((pos < 0) | (pos >= ctx)).any()):
        raise ModelInputError(
            f"token_positions must lie in 0..{ctx - 1} (context_length={ctx}); "
            f"got min {int(pos.min())}, max {int(pos.max())}"
        )
    return pos


def values_checkable(t: Tensor) -> bool:
    """Whether reading tensor values is possible and cheap: not on meta, not inside
    torch.compile (a data-dependent branch would break the graph; eager runs still check)."""
    return t.device.type != "meta" and not torch.compiler.is_compiling()
