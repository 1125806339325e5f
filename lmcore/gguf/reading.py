"""Reading a GGUF file through the `gguf` package: its metadata as Python values and its tensors
dequantized to float32 `torch` tensors in lmcore's (row-major, PyTorch) shape.

    file = read_gguf("model.gguf")        # metadata and the tensors' descriptions, no data read
    file.metadata["general.architecture"] # "llama"
    w = file.tensor("blk.0.attn_q.weight")  # float32, shape (out_features, in_features)

GGUF lists a tensor's dimensions innermost first (`ne`); `gguf.GGUFReader` gives the data in
numpy's order already, so a weight comes out as PyTorch holds it. Every type `gguf.quants`
dequantizes is read: F32, F16, BF16, the legacy blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the
K-quants (Q2_K ... Q6_K) and the others it implements (IQ*, TQ*, MXFP4); a type it does not know
is refused, naming the tensor.

Before the `gguf` package parses anything, `check_layout` walks the header, the metadata and the
tensor descriptions itself, checking every count and length the file gives against the bytes
left in it (a string array claiming 2**62 items in a 200 MB file is refused at once, in bounded
memory, where the reader would loop on it). GGUF has no checksum: damage inside a tensor's data
cannot be detected here (only values that are not finite are), which is why the checkpoint
written from it carries lmcore's own.
"""

from __future__ import annotations

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

from lmcore.errors import ConversionError, clip

__all__ = ["EXTRA", "GGUFFile", "TensorEntry", "check_layout", "import_gguf", "read_gguf"]

EXTRA: Final = "pip install 'lmcore-registry[gguf]'"
_MAGIC: Final = b"GGUF"
# GGUF value types (gguf.GGUFValueType) -> the bytes of one value; STRING (8) and ARRAY (9) vary
_FIXED: Final = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES: Final = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
                      "string", "array", "uint64", "int64", "float64")  # fmt: skip
_MAX_DIMS: Final = 4  # GGML_MAX_DIMS
_MAX_NESTING: Final = 8  # arrays of arrays: llama.cpp writes none; more is not a model's metadata


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
    """One tensor as the file describes it: GGML type name (e.g. "Q4_1"), PyTorch shape."""

    name: str
    type: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """An open GGUF file: its metadata (key -> Python value; arrays as lists) and tensors."""

    path: Path
    metadata: Mapping[str, Any]
    tensors: Mapping[str, TensorEntry]
    reader: Any  # gguf.GGUFReader, which memory-maps the file

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ConversionError(
                f"{self.path}: has no general.architecture, which every GGUF model states"
            )
        return arch

    def tensor(self, name: str) -> Tensor:
        """Tensor `name`, dequantized to float32 (F16 and BF16 are widened exactly)."""
        gguf = import_gguf()
        entry = self.tensors[name]
        raw = self._raw[name]
        qtype = raw.tensor_type
        try:
            values = gguf.quants.dequantize(np.asarray(raw.data), qtype)
        except NotImplementedError:
            raise ConversionError(
                f"{self.path}: tensor {name} is of type {entry.type}, which the installed gguf "
                f"package ({getattr(gguf, '__version__', '?')}) cannot dequantize; convert the "
                "file to another type (llama-quantize), or upgrade gguf"
            ) from None
        values = np.ascontiguousarray(values, dtype=np.float32)
        if not values.flags.writeable:  # F32 data is a view of the read-only memory map
            values = values.copy()
        return torch.from_numpy(values).reshape(entry.shape)

    @property
    def _raw(self) -> dict[str, Any]:
        return {t.name: t for t in self.reader.tensors}

    def tensors_float(self) -> dict[str, Tensor]:
        """Every tensor, dequantized to float32."""
        return {name: self.tensor(name) for name in self.tensors}


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file: `ConversionError` for a missing file, one that is not GGUF, or one the
    gguf package cannot parse (cut short, damaged)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        raise ConversionError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ConversionError(f"{p}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise ConversionError(f"{p}: cannot be read: {e.strerror or e}") from None
    if magic != _MAGIC:
        raise ConversionError(
            f"{p}: is not a GGUF file (it does not start with the bytes 'GGUF'); --from-gguf "
            "reads the files llama.cpp, Ollama and LM Studio use (for a Hugging Face model "
            "directory, --from-hf)"
        )
    check_layout(p)
    gguf = import_gguf()
    try:
        reader = gguf.GGUFReader(str(p))
    except Exception as e:  # the reader raises ValueError, IndexError, ... on damaged files
        raise ConversionError(
            f"{p}: cannot be read as GGUF ({type(e).__name__}: {clip(str(e), 200, quote=False)}); "
            "the file is damaged or cut short (an interrupted download?): fetch it again"
        ) from None
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue  # the header's own counts
        metadata[key] = _value(field)
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(list(t.shape)))
        tensors[t.name] = TensorEntry(t.name, t.tensor_type.name, shape, int(t.n_bytes))
    return GGUFFile(p, metadata, tensors, reader)


def _value(field: Any) -> Any:
    """A field's value as Python's; a float32 as the shortest decimal that is that float32
    (1e-05, not 9.999999747378752e-06: the value the model's config had)."""
    value = field.contents()
    if len(field.types) == 1 and field.types[0].name == "FLOAT32":
        return float(str(np.float32(value)))
    if isinstance(value, np.generic):
        return value.item()
    return value


class _Layout:
    """A cursor over a GGUF file's bytes that checks each length against what is left."""

    def __init__(self, data: mmap.mmap | bytes, path: Path, order: str) -> None:
        self.data, self.path, self.order, self.at = data, path, order, 0

    def fail(self, what: str, needs: int) -> ConversionError:
        left = len(self.data) - self.at
        return ConversionError(
            f"{self.path}: {what} needs {needs:,} bytes at offset {self.at:,}, but the file has "
            f"{left:,} left; the file is damaged or cut short (an interrupted download?): fetch "
            "it again"
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
        return bytes(self.data[start : start + n]).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str, depth: int = 0) -> None:
        """Skip one value of GGUF type `kind`, checking its lengths."""
        if kind in _FIXED:
            self.take(_FIXED[kind], f"the value of {key}")
        elif kind == _STRING:
            self.string(f"the string value of {key}")
        elif kind == _ARRAY:
            self.array(key, depth)
        else:
            raise ConversionError(
                f"{self.path}: metadata key {key} has value type {kind}, which GGUF does not "
                "define (0-12); the file is damaged: fetch it again"
            )

    def array(self, key: str, depth: int) -> None:
        if depth >= _MAX_NESTING:
            raise ConversionError(
                f"{self.path}: metadata key {key} nests arrays more than {_MAX_NESTING} deep; the "
                "file is damaged: fetch it again"
            )
        kind = self.uint(4, f"the item type of array {key}")
        count = self.uint(8, f"the item count of array {key}")
        # the fewest bytes `count` items take, checked before any item is read
        least = _FIXED.get(kind, 8 if kind == _STRING else 12)
        if count * least > len(self.data) - self.at:
            kind_name = _TYPE_NAMES[kind] if kind < len(_TYPE_NAMES) else f"type {kind}"
            what = f"array {key}, which claims {count:,} {kind_name} items,"
            raise self.fail(what, count * least)
        if kind in _FIXED:
            self.take(count * _FIXED[kind], f"array {key}")
            return
        for _ in range(count):
            self.value(kind, key, depth + 1)


def check_layout(path: Path) -> None:
    """Walk the file's header, metadata and tensor descriptions, checking every count and
    length against the bytes left (`ConversionError` naming the key or tensor), before the
    gguf package allocates anything they size. A version the reader does not know is left for
    it to refuse."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data: mmap.mmap | bytes = (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            )
    except OSError as e:
        raise ConversionError(f"{path}: cannot be read: {e.strerror or e}") from None
    try:
        cursor = _Layout(data, path, "<")
        cursor.take(4, "the magic")
        version = cursor.uint(4, "the version")
        if version & 0xFFFF == 0:  # a file written for the other byte order
            cursor.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in (2, 3):
            return
        tensors = cursor.uint(8, "the tensor count")
        keys = cursor.uint(8, "the metadata key count")
        if keys * 13 > size - cursor.at:  # a key: its length (8), its type (4), one byte
            raise cursor.fail(f"the header's {keys:,} metadata keys", keys * 13)
        for i in range(keys):
            key = cursor.string(f"metadata key {i}")
            cursor.value(cursor.uint(4, f"the type of {key}"), key)
        if tensors * 28 > size - cursor.at:  # name length, dims, one dim, type, offset
            raise cursor.fail(f"the header's {tensors:,} tensor descriptions", tensors * 28)
        for i in range(tensors):
            name = cursor.string(f"the name of tensor {i}")
            dims = cursor.uint(4, f"the dimension count of tensor {name}")
            if dims > _MAX_DIMS:
                raise ConversionError(
                    f"{path}: tensor {name} claims {dims:,} dimensions (GGUF holds at most "
                    f"{_MAX_DIMS}); the file is damaged: fetch it again"
                )
            cursor.take(8 * dims + 12, f"the description of tensor {name}")
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
