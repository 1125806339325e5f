"""Checks of what a model is given: build options, token ids, positions and document ids.

Bad input raises `ModelInputError` (a `ValueError`) or `ModelInputTypeError` (a `TypeError`)
naming the value, where it is and what is allowed, never an opaque index error deep inside;
a bad device or dtype for a build raises `BuildOptionError`.

Under `torch.compile` the value checks run too: `checked` is a custom operator, opaque to the
compiler, that runs the same eager check on the real tensors and hands them on, so a compiled
model never wraps a negative id around nor reads past the table (which aborts the process with
inductor on the CPU). Its output feeds the lookup, so no backend can reorder or drop it.
"""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from lmcore.errors import BuildOptionError, ModelInputError, ModelInputTypeError

# Index dtypes torch's lookups take as they are; other integer dtypes are widened to int64
# (uint8 would otherwise be read as a boolean mask).
_INDEX_DTYPES = (torch.int32, torch.int64)
# What weights can be built in (initialisation needs a float type with a normal sampler).
_WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_ids(
    ids: object,
    *,
    vocab_size: int,
    context_length: int,
    device: torch.device | None = None,
) -> Int[Tensor, "... T"]:
    """`ids` once it is a dense integer tensor `(..., T)` on `device` (the model's) with
    `1 <= T <= context_length` and every value in `0..vocab_size-1`; int8/int16/uint8 ids are
    widened to int64."""
    ids = _integer_tensor(ids, "token ids", device)
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
    return _values_in_range(ids, vocab_size, "ids")


def check_positions(
    token_positions: object, ids: Int[Tensor, "B T"], *, context_length: int
) -> Int[Tensor, "B_or_1 T"]:
    """The `(B or 1, T)` positions of `ids`: `arange(T)` when none are given, else the given
    ones once they are integers in `0..context_length-1` with one row or one per sequence."""
    seq = ids.shape[-1]
    if token_positions is None:
        return torch.arange(seq, device=ids.device)[None, :]  # (1, T)
    pos = _integer_tensor(token_positions, "token_positions", ids.device)
    if pos.ndim == 0 or pos.shape[-1] != seq:
        raise ModelInputError(
            f"token_positions must be integers of shape (..., {seq}); "
            f"got dtype {pos.dtype}, shape {tuple(pos.shape)}"
        )
    pos = pos.reshape(-1, seq)
    if pos.shape[0] not in (1, ids.shape[0]):
        raise ModelInputError(
            f"token_positions has {pos.shape[0]} rows for a batch of {ids.shape[0]}"
        )
    return _values_in_range(pos, context_length, "positions")


def check_documents(documents: object, ids: Int[Tensor, "B T"]) -> Int[Tensor, "B T"]:
    """The `(B, T)` int64 document ids of `ids`, once they are integers of the ids' shape
    (before the batch dimensions are flattened: `(..., T)`) that never decrease along a row.
    Meta tensors hold no values to check."""
    docs = _integer_tensor(documents, "documents", ids.device).long()
    seq = ids.shape[-1]
    if docs.ndim == 0 or docs.shape[-1] != seq or docs.numel() != ids.numel():
        raise ModelInputError(
            f"documents must be integers of the token ids' shape, one document id per token "
            f"(B, {seq}); got shape {tuple(docs.shape)} for {ids.shape[0]} row(s)"
        )
    docs = docs.reshape(-1, seq)
    if docs.device.type != "meta" and not torch.compiler.is_compiling():
        down = docs[:, 1:] < docs[:, :-1]
        if bool(down.any()):
            row, at = (int(i) for i in down.nonzero()[0])
            raise ModelInputError(
                f"documents must not decrease along a row (equal ids are one document, e.g. "
                f"0 0 0 1 1 2): row {row} goes from {int(docs[row, at])} to "
                f"{int(docs[row, at + 1])} at index {at + 1}"
            )
    return docs


def _integer_tensor(t: object, what: str, device: torch.device | None) -> Tensor:
    """`t` as a dense integer tensor on `device` (int8/int16/uint8 widened to int64)."""
    var = "ids" if what == "token ids" else what  # the name messages tell the user to fix
    if not isinstance(t, Tensor):
        raise ModelInputTypeError(
            f"{what} must be a torch.Tensor, got {type(t).__name__}; use torch.tensor(...)"
        )
    if t.layout != torch.strided:
        raise ModelInputTypeError(
            f"{what} must be a dense tensor, got layout {t.layout}; convert with {var}.to_dense()"
        )
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ModelInputTypeError(
            f"{what} must be an integer tensor, got dtype {t.dtype}; convert with {var}.long()"
        )
    if device is not None and t.device != device:
        raise ModelInputError(
            f"{what} are on {t.device} but the model is on {device}; "
            f"move them with {var}.to({str(device)!r})"
        )
    return t if t.dtype in _INDEX_DTYPES else t.long()


def _values_in_range(t: Tensor, bound: int, kind: str) -> Tensor:
    """`t` once every value is in `0..bound-1`: checked eagerly, or by the `checked` operator
    inside torch.compile. Meta tensors hold no values to check."""
    if t.device.type == "meta":
        return t
    if torch.compiler.is_compiling():
        out: Tensor = torch.ops.lmcore.checked(t, bound, kind)
        return out
    _raise_out_of_range(t, bound, kind)
    return t


def _raise_out_of_range(t: Tensor, bound: int, kind: str) -> None:
    bad = (t < 0) | (t >= bound)
    if not bool(bad.any()):
        return
    if kind == "ids":
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise ModelInputError(
            f"token id {int(t[where])} at index {where} is out of range for "
            f"vocab_size={bound} (valid ids: 0..{bound - 1})"
        )
    raise ModelInputError(
        f"token_positions must lie in 0..{bound - 1} (context_length={bound}); "
        f"got min {int(t.min())}, max {int(t.max())}"
    )


@torch.library.custom_op("lmcore::checked", mutates_args=())
def checked(t: Tensor, bound: int, kind: str) -> Tensor:
    """A copy of `t` once every value is in `0..bound-1` (`kind`: "ids" or "positions" picks
    the message); the compiled counterpart of the eager check."""
    _raise_out_of_range(t, bound, kind)
    return t.clone()


@checked.register_fake
def _(t: Tensor, bound: int, kind: str) -> Tensor:
    return torch.empty_like(t)


# ------------------------------------------------------------------------------ build options


def check_device(
    device: torch.device | str | None, choices: str = "cpu, meta, cuda or cuda:N"
) -> torch.device:
    """`device` as a `torch.device` this torch build can allocate on (None: the CPU);
    `choices` is what the message for an unknown one suggests."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise BuildOptionError(
            f"unknown device {device!r}; use {choices} (or another torch device)"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BuildOptionError(
                f"device {str(device)!r}: CUDA is not available in this torch build "
                f"({torch.__version__}) or on this machine; use cpu (or meta to build without "
                "allocating)"
            )
        visible = torch.cuda.device_count()
        if dev.index is not None and dev.index >= visible:
            raise BuildOptionError(
                f"device {str(device)!r}: only {visible} CUDA device(s) are visible; "
                f"use cuda:0 .. cuda:{visible - 1}"
            )
        return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    if dev.type not in ("cpu", "meta"):
        backend = getattr(torch, dev.type, None)
        available = getattr(backend, "is_available", None)
        if callable(available) and not available():
            raise BuildOptionError(f"device {str(device)!r} is not available on this machine")
    return dev


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when available, else the CPU; anything else must be a usable device
    (`check_device`), and not meta."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "meta" or (isinstance(name, torch.device) and name.type == "meta"):
        raise BuildOptionError("device 'meta' holds no numbers to train on; use cpu or cuda")
    return check_device(name, choices="auto, cpu, cuda or cuda:N")


def check_dtype(dtype: object) -> torch.dtype:
    """`dtype` once weights can be built in it (None: torch's default)."""
    if dtype is None:
        return torch.get_default_dtype()
    if dtype not in _WEIGHT_DTYPES:
        raise BuildOptionError(
            f"dtype {dtype!r} cannot hold trainable weights; use a floating-point dtype: "
            "torch.float32, torch.bfloat16, torch.float16 (or torch.float64)"
        )
    return dtype
