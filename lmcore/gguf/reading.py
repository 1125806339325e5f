"""Reading a GGUF file: its header, metadata and tensor descriptions parsed here, its metadata as
Python values and its tensors dequantized to float32 `torch` tensors in lmcore's (row-major,
PyTorch) shape.

    file = read_gguf("model.gguf")        # metadata and the tensors' descriptions, no data read
    file.metadata["general.architecture"] # "llama"
    w = file.tensor("blk.0.attn_q.weight")  # float32, shape (out_features, in_features)
    b = file.raw("blk.0.attn_q.weight")   # the file's bytes, (rows, bytes per row) uint8

`read_gguf` walks the header, the metadata and the tensor descriptions itself (`_Layout`),
checking every count and length the file gives against the bytes left in it before anything
it sizes is allocated (a string array claiming 2**62 items in a 200 MB file is refused at once,
in bounded memory), and every tensor's data against the file's end. An array of numbers is read
in one go (`numpy.frombuffer`), so a 49,152-token vocabulary costs its Python list and nothing
beside it. The file is memory-mapped only while the header is walked; a tensor's bytes are read
when asked for (`GGUFFile.raw`) into a buffer of their own, so no page of the file stays in the
process's memory after it.

GGUF lists a tensor's dimensions innermost first (`ne`); `TensorEntry.shape` is numpy's (and
PyTorch's) order, so a weight comes out as PyTorch holds it. The gguf package gives the types'
block sizes (`gguf.GGML_QUANT_SIZES`) and the dequantizing: F32, F16, BF16, the legacy blocks
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the K-quants (Q2_K ... Q6_K) and the others it implements (IQ*,
TQ*, MXFP4); a type it does not know is refused, naming the tensor. GGUF has no checksum: damage
inside a tensor's data cannot be detected here (only values that are not finite are), which is
why the checkpoint written from it carries lmcore's own.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from torch import Tensor

from lmcore.errors import ConversionError

__all__ = ["EXTRA", "GGUFFile", "TensorEntry", "import_gguf", "read_gguf"]

EXTRA: Final = "pip install 'lmcore-registry[gguf]'"
_MAGIC: Final = b"GGUF"
# GGUF value types (gguf.GGUFValueType) -> their struct code; STRING (8) and ARRAY (9) vary
_CODES: Final = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}  # fmt: skip
_FIXED: Final = {kind: struct.calcsize(code) for kind, code in _CODES.items()}
_STRING, _ARRAY, _FLOAT32, _UINT32 = 8, 9, 6, 4
_TYPE_NAMES: Final = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
                      "string", "array", "uint64", "int64", "float64")  # fmt: skip
_MAX_DIMS: Final = 4  # GGML_MAX_DIMS
_MAX_NESTING: Final = 8  # arrays of arrays: llama.cpp writes none; more is not a model's metadata
_ALIGNMENT: Final = 32  # GGUF_DEFAULT_ALIGNMENT, unless general.alignment says otherwise
# GGML types whose data is an array of elements (as gguf.GGUFReader gives them); the others'
# is bytes, `(..., bytes per row)`
_ELEMENTS: Final = {"F32": "f4", "F16": "f2", "F64": "f8", "I8": "i1", "I16": "i2", "I32": "i4",
                    "I64": "i8"}  # fmt: skip
_REFETCH: Final = "the file is damaged or cut short (an interrupted download?): fetch it again"


def import_gguf() -> Any:
    """The `gguf` package, or `ConversionError` saying which extra brings it."""
    try:
        import gguf
    except ImportError:
        raise ConversionError(
            f"reading and writing GGUF files needs the gguf package, which comes with the 'gguf' "
            f"extra: {EXTRA}"
        ) from None
    return gguf


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the file describes it: GGML type name (e.g. "Q4_1"), PyTorch shape, the
    bytes of its data and where they start in the file; `ggml`, the type's number."""

    name: str
    type: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    ggml: int

    @property
    def dims(self) -> tuple[int, ...]:
        """GGUF's `ne`: the dimensions innermost first."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True)
class GGUFFile:
    """An open GGUF file: its metadata (key -> Python value; arrays as lists) and tensors, whose
    data is read from `path` when asked for. `order`: the file's byte order ("<" or ">")."""

    path: Path
    metadata: Mapping[str, Any]
    tensors: Mapping[str, TensorEntry]
    order: str = "<"

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ConversionError(
                f"{self.path}: has no general.architecture, which every GGUF model states"
            )
        return arch

    def raw(self, name: str) -> np.ndarray[Any, Any]:
        """Tensor `name`'s data as the file holds it, in a buffer of its own (writable, no page
        of the file mapped): the elements for F32, F16, F64 and the integer types, in numpy's
        shape and this machine's byte order; the bytes for the others (BF16 and the quantized
        types), `(..., bytes per row)` uint8, a matrix's `(rows, bytes per row)`."""
        gguf = import_gguf()
        entry = self.tensors[name]
        out = np.empty(entry.nbytes, np.uint8)
        _read_into(self.path, entry, out)
        element = _ELEMENTS.get(entry.type)
        if element is None:
            shape = gguf.quants.quant_shape_to_byte_shape(entry.shape, _qtype(gguf, entry))
            return out.reshape(shape)
        values = out.view(np.dtype(element).newbyteorder(self.order))
        if not values.dtype.isnative:
            values = values.byteswap(inplace=True).view(values.dtype.newbyteorder("="))
        return values.reshape(entry.shape)

    def tensor(self, name: str) -> Tensor:
        """Tensor `name`, dequantized to float32 (F16 and BF16 are widened exactly)."""
        gguf = import_gguf()
        entry = self.tensors[name]
        raw = self.raw(name)
        try:
            values = gguf.quants.dequantize(raw, _qtype(gguf, entry))
        except NotImplementedError:
            raise ConversionError(
                f"{self.path}: tensor {name} is of type {entry.type}, which the installed gguf "
                f"package ({getattr(gguf, '__version__', '?')}) cannot dequantize; convert the "
                "file to another type (llama-quantize), or upgrade gguf"
            ) from None
        del raw
        values = np.ascontiguousarray(values, dtype=np.float32)  # F32: the buffer itself
        return torch.from_numpy(values).reshape(entry.shape)

    def tensors_float(self) -> dict[str, Tensor]:
        """Every tensor, dequantized to float32."""
        return {name: self.tensor(name) for name in self.tensors}


def _qtype(gguf: Any, entry: TensorEntry) -> Any:
    return gguf.GGMLQuantizationType(entry.ggml)


def _read_into(path: Path, entry: TensorEntry, out: np.ndarray[Any, Any]) -> None:
    """`entry`'s bytes from `path` into `out` (read, not mapped: no page of the file stays
    counted in the process's memory)."""
    view = memoryview(out).cast("B")
    done = 0
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(entry.offset)
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    break
                done += got
    except OSError as e:
        raise ConversionError(f"{path}: cannot be read: {e.strerror or e}") from None
    if done < len(view):
        raise ConversionError(
            f"{path}: tensor {entry.name}'s data ({entry.nbytes:,} bytes at offset "
            f"{entry.offset:,}) ends after {done:,}: the file was cut short while it was read"
        )


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file: its header, metadata and tensor descriptions, checked (`_Layout`);
    `ConversionError` for a missing file, one that is not GGUF, one cut short or damaged."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data: mmap.mmap | bytes = (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            )
    except FileNotFoundError:
        raise ConversionError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ConversionError(f"{p}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise ConversionError(f"{p}: cannot be read: {e.strerror or e}") from None
    try:
        if data[:4] != _MAGIC:
            raise ConversionError(
                f"{p}: is not a GGUF file (it does not start with the bytes 'GGUF'); --from-gguf "
                "reads the files llama.cpp, Ollama and LM Studio use (for a Hugging Face model "
                "directory, --from-hf)"
            )
        return _parse(_Layout(data, p, "<"))
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _parse(cursor: _Layout) -> GGUFFile:
    """The header, the metadata and the tensor descriptions, every length checked."""
    path, size = cursor.path, len(cursor.data)
    cursor.take(4, "the magic")
    version = cursor.uint(4, "the version")
    if version & 0xFFFF == 0:  # a file written for the other byte order
        cursor.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in (2, 3):
        raise ConversionError(
            f"{path}: is GGUF version {version} (at offset 4), and lmcore reads versions 2 and "
            "3 (llama.cpp's since August 2023); convert the model again with a current llama.cpp"
        )
    tensors = cursor.uint(8, "the tensor count")
    keys = cursor.uint(8, "the metadata key count")
    if keys * 13 > size - cursor.at:  # a key: its length (8), its type (4), one byte
        raise cursor.fail(f"the header's {keys:,} metadata keys", keys * 13)
    metadata: dict[str, Any] = {}
    kinds: dict[str, int] = {}
    for i in range(keys):
        at = cursor.at
        key = cursor.string(f"metadata key {i}")
        kind = cursor.uint(4, f"the type of {key}")
        if key in metadata:
            raise ConversionError(
                f"{path}: metadata key {key} appears twice (again at offset {at:,}); the file is "
                "damaged: fetch it again"
            )
        metadata[key], kinds[key] = cursor.value(kind, key), kind
    alignment = _alignment(metadata, kinds, path)
    if tensors * 28 > size - cursor.at:  # name length, dims, one dim, type, offset
        raise cursor.fail(f"the header's {tensors:,} tensor descriptions", tensors * 28)
    described = [cursor.tensor(i) for i in range(tensors)]
    start = -(-cursor.at // alignment) * alignment
    entries: dict[str, TensorEntry] = {}
    gguf = import_gguf()
    for name, dims, ggml, offset, at in described:
        if name in entries:
            raise ConversionError(
                f"{path}: tensor {name} is described twice (again at offset {at:,}); the file is "
                "damaged: fetch it again"
            )
        entries[name] = _entry(gguf, path, size, name, dims, ggml, start + offset, at)
    return GGUFFile(path, metadata, entries, cursor.order)


def _alignment(metadata: Mapping[str, Any], kinds: Mapping[str, int], path: Path) -> int:
    """general.alignment (GGUF's default 32 without it): a uint32 power of two."""
    if "general.alignment" not in metadata:
        return _ALIGNMENT
    value, kind = metadata["general.alignment"], kinds["general.alignment"]
    if kind != _UINT32 or value <= 0 or value & (value - 1):
        what = f"{value!r} ({_kind_name(kind)})" if kind != _ARRAY else "an array"
        raise ConversionError(
            f"{path}: general.alignment is {what}, where GGUF has a uint32 power of two; the "
            "file is damaged: fetch it again"
        )
    return int(value)


def _entry(
    gguf: Any, path: Path, size: int, name: str, dims: tuple[int, ...], ggml: int, begin: int,
    at: int,
) -> TensorEntry:  # fmt: skip
    """A tensor's description checked: a type the gguf package knows, whole blocks in a row,
    its data inside the file."""
    try:
        qtype = gguf.GGMLQuantizationType(ggml)
    except ValueError:
        raise ConversionError(
            f"{path}: tensor {name} (described at offset {at:,}) has GGML type {ggml}, which the "
            f"installed gguf package ({getattr(gguf, '__version__', '?')}) does not know; the "
            "file is damaged, or newer than gguf: upgrade gguf, or fetch the file again"
        ) from None
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if block > 1 and (not dims or dims[0] % block):
        row = dims[0] if dims else "no"
        raise ConversionError(
            f"{path}: tensor {name} (described at offset {at:,}) is {qtype.name} with rows of "
            f"{row} values, not whole blocks of {block}; the file is damaged: fetch it again"
        )
    nbytes = math.prod(dims) * type_size // block
    if begin + nbytes > size:
        raise ConversionError(
            f"{path}: tensor {name}'s data ({nbytes:,} bytes at offset {begin:,}) runs past the "
            f"file's end ({size:,} bytes); {_REFETCH}"
        )
    return TensorEntry(name, qtype.name, tuple(reversed(dims)), nbytes, begin, ggml)


def _kind_name(kind: int) -> str:
    return _TYPE_NAMES[kind] if 0 <= kind < len(_TYPE_NAMES) else f"type {kind}"


class _Layout:
    """A cursor over a GGUF file's bytes that checks each length against what is left and
    returns the values it walks."""

    def __init__(self, data: mmap.mmap | bytes, path: Path, order: str) -> None:
        self.data, self.path, self.order, self.at = data, path, order, 0

    def fail(self, what: str, needs: int) -> ConversionError:
        left = len(self.data) - self.at
        return ConversionError(
            f"{self.path}: {what} needs {needs:,} bytes at offset {self.at:,}, but the file has "
            f"{left:,} left; {_REFETCH}"
        )

    def take(self, n: int, what: str) -> int:
        if n > len(self.data) - self.at:
            raise self.fail(what, n)
        start = self.at
        self.at += n
        return start

    def uint(self, size: int, what: str) -> int:
        start = self.take(size, what)
        code = {4: "I", 8: "Q"}[size]
        value: int = struct.unpack_from(self.order + code, self.data, start)[0]
        return value

    def string(self, what: str) -> str:
        n = self.uint(8, what)
        start = self.take(n, f"{what} ({n:,} bytes long)")
        try:
            return self.data[start : start + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConversionError(
                f"{self.path}: {what} is not UTF-8 (byte {e.start:,} of the {n:,} at offset "
                f"{start:,}); the file is damaged: fetch it again"
            ) from None

    def value(self, kind: int, key: str, depth: int = 0) -> Any:
        """One value of GGUF type `kind` as Python's (a float32 as the shortest decimal that is
        that float32: 1e-05, not 9.999999747378752e-06, the value the model's config had)."""
        if kind in _CODES:
            start = self.take(_FIXED[kind], f"the value of {key}")
            value = struct.unpack_from(self.order + _CODES[kind], self.data, start)[0]
            return float(str(np.float32(value))) if kind == _FLOAT32 else value
        if kind == _STRING:
            return self.string(f"the string value of {key}")
        if kind == _ARRAY:
            return self.array(key, depth)
        raise ConversionError(
            f"{self.path}: metadata key {key} has value type {kind} (its value at offset "
            f"{self.at:,}), which GGUF does not define (0-12); the file is damaged: fetch it again"
        )

    def array(self, key: str, depth: int) -> list[Any]:
        """An array's items: numbers in one read (as numpy gives them: a float32 item is the
        float it is), strings and arrays one by one."""
        if depth >= _MAX_NESTING:
            raise ConversionError(
                f"{self.path}: metadata key {key} nests arrays more than {_MAX_NESTING} deep (at "
                f"offset {self.at:,}); the file is damaged: fetch it again"
            )
        kind = self.uint(4, f"the item type of array {key}")
        count = self.uint(8, f"the item count of array {key}")
        # the fewest bytes `count` items take, checked before any item is read
        least = _FIXED.get(kind, 8 if kind == _STRING else 12)
        if count * least > len(self.data) - self.at:
            what = f"array {key}, which claims {count:,} {_kind_name(kind)} items,"
            raise self.fail(what, count * least)
        if kind in _CODES:
            start = self.take(count * _FIXED[kind], f"array {key}")
            items = np.frombuffer(self.data[start : self.at], self.order + _CODES[kind])
            out: list[Any] = items.tolist()
            return out
        if kind == _STRING:
            what = f"an item of array {key}"
            return [self.string(what) for _ in range(count)]
        return [self.value(kind, key, depth + 1) for _ in range(count)]

    def tensor(self, i: int) -> tuple[str, tuple[int, ...], int, int, int]:
        """Tensor description `i`: its name, `ne`, GGML type number, offset in the data and
        where the description starts."""
        at = self.at
        name = self.string(f"the name of tensor {i}")
        n = self.uint(4, f"the dimension count of tensor {name}")
        if n > _MAX_DIMS:
            raise ConversionError(
                f"{self.path}: tensor {name} claims {n:,} dimensions (GGUF holds at most "
                f"{_MAX_DIMS}; at offset {self.at - 4:,}); the file is damaged: fetch it again"
            )
        start = self.take(8 * n + 12, f"the description of tensor {name}")
        *dims, ggml, offset = struct.unpack_from(f"{self.order}{n}QIQ", self.data, start)
        return name, tuple(dims), ggml, offset, at
