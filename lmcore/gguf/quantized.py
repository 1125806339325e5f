"""GGUF's quantized tensors kept quantized, both ways (`--keep-quantized`, `--to-gguf` of a
quantized checkpoint).

A file whose matrices are Q8_0, Q4_0 or Q4_1 (`KEPT`) reads as a model with
``quant=<format>(embedding=<format of token_embd>)``: each block is kept as the file holds it
(`lmcore_quant`'s formats take GGML's bytes), so nothing is rounded again and writing the model
back gives the same bytes. What llama.cpp's converter changes in a matrix's layout (q/k rows
interleaved, q/k/v regrouped) moves whole rows, and blocks run along a row, so a row of lmcore's
matrix is a row of the file's tensor: which one is found by sending row numbers through the
float path's own renaming and un-permuting (`row_sources`), never by a second table. A layout
that moves anything but whole rows (GPT-2's transposed Conv1D weights) cannot keep its blocks
and is refused by name, as is a matrix of another type (the K-quants: Q4_K_M files mix Q4_K and
Q6_K), with the way out: convert without --keep-quantized (dequantized to float32).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

import numpy as np
import torch
from torch import Tensor

from lmcore.errors import ConversionError, one_of
from lmcore.model.quant import targets

__all__ = [
    "FILE_TYPES", "KEPT", "float_blueprint", "kept_targets", "numbered", "quant_text",
    "refused", "row_sources", "rows_of", "thin",
]  # fmt: skip

# GGML types kept as they are -> lmcore's weight format (`plugins/lmcore_quant.py`).
KEPT: Final = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1"}
# The format -> general.file_type (llama.cpp's LLAMA_FTYPE_MOSTLY_*).
FILE_TYPES: Final = {"Q8_0": 7, "Q4_0": 2, "Q4_1": 3}
_EMBEDDING: Final = "token_embd.weight"
_OUT: Final = "out.gguf"


def quant_text(types: Mapping[str, str], where: object) -> str:
    """The `quant=` value for a file whose matrices (2-D tensors) have `types` (name -> GGML
    type): the matrices' one type, the embedding's as `embedding=`; `ConversionError` naming
    a tensor whose type lmcore cannot keep, or two types among the matrices."""
    fix = "convert without --keep-quantized (the weights dequantized to float32)"
    for name, kind in types.items():
        if kind not in KEPT:
            raise ConversionError(
                f"{where}: tensor {name} is {kind}, which lmcore cannot keep quantized (it keeps "
                f"{one_of(KEPT)}); {fix}"
            )
    others = {k for n, k in types.items() if n != _EMBEDDING}
    if len(others) > 1:
        listed = ", ".join(
            f"{next(n for n, t in types.items() if t == k)} {k}" for k in sorted(others)
        )
        raise ConversionError(
            f"{where}: its matrices are of {len(others)} types ({listed}), and a model keeps "
            f"one format for its matrices (and one for its embedding); {fix}"
        )
    embedding = types.get(_EMBEDDING)
    main = next(iter(others)) if others else embedding
    if main is None:
        raise ConversionError(f"{where}: holds no quantized matrix to keep; {fix}")
    tail = "" if embedding in (None, main) else f"(embedding={KEPT[embedding]})"
    return KEPT[main] + tail


def float_blueprint(bp: Any) -> Any:
    """`bp` without its weight format: the float model the tables map (the HF family's
    config, GGUF's metadata and tensor names know nothing of `quant`)."""
    return replace(bp, spec=replace(bp.spec, quant=None),
                   parts={k: v for k, v in bp.parts.items() if k != "quant"})  # fmt: skip


def numbered(shapes: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, Tensor], Tensor, list[str]]:
    """For each matrix `(N, K)`, an `(N, 1)` int64 column holding its global row numbers (the
    matrices' rows one after another): what moves rows moves these alike, at 8 bytes a row;
    the first global row of each; the names in that order."""
    out: dict[str, Tensor] = {}
    names, starts, base = [], [], 0
    for name, shape in shapes.items():
        n = shape[0]
        out[name] = (torch.arange(n, dtype=torch.int64) + base)[:, None]
        names.append(name)
        starts.append(base)
        base += n
    return out, torch.tensor(starts, dtype=torch.int64), names


def thin(shapes: Mapping[str, tuple[int, ...]], keys: list[str]) -> dict[str, tuple[int, ...]]:
    """`shapes` with the matrices of `keys` one column wide, as `numbered` makes them."""
    return {k: (v[0], 1) if k in keys else v for k, v in shapes.items()}


def row_sources(
    converted: Mapping[str, Tensor],
    wanted: list[str],
    starts: Tensor,
    names: list[str],
    where: object,
) -> dict[str, tuple[str, Tensor]]:
    """Where each row of each matrix in `wanted` comes from, `{key: (source name, rows)}`,
    read off `converted`: `numbered` columns sent through the float path's renaming and
    re-laying. A matrix whose rows are not rows of one source is a `ConversionError`."""
    out: dict[str, tuple[str, Tensor]] = {}
    for key in wanted:
        t = converted[key]
        first = t.reshape(-1).contiguous()
        which = torch.searchsorted(starts, first, right=True) - 1
        if t.dtype != torch.int64 or t.shape[-1] != 1 or bool((which != which[0]).any()):
            raise refused(key, where)
        j = int(which[0])
        out[key] = (names[j], first - starts[j])
    return out


def refused(key: str, where: object, why: str = "") -> ConversionError:
    return ConversionError(
        f"{where}: the conversion moves {key}'s weights across rows (a transpose or a join of "
        f"tensors{why}), so its blocks cannot be kept; convert without --keep-quantized (the "
        "weights dequantized to float32)"
    )


def rows_of(raw: Any, rows: Tensor) -> Tensor:
    """Rows `rows` of a GGUF tensor's raw bytes (a numpy uint8 array, one row per weight row,
    `GGUFFile.raw`'s own buffer): all of them in order are that buffer, not a copy."""
    data = np.asarray(raw)
    if len(rows) == len(data) and bool((rows == torch.arange(len(rows))).all()):
        return torch.from_numpy(np.ascontiguousarray(data))
    return torch.from_numpy(np.ascontiguousarray(data[rows.numpy()]))


def kept_targets(model: Any) -> list[tuple[str, int, int, str]]:
    """`(key, out, in, role)` of each matrix a weight format stores in the float `model`."""
    out = []
    for name, m, role in targets(model):
        n, k = m.weight.shape
        out.append((f"{name}.weight", int(n), int(k), role))
    return out
