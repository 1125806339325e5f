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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from torch import Tensor

from lmcore.errors import ConversionError, clip

__all__ = ["EXTRA", "GGUFFile", "TensorEntry", "import_gguf", "read_gguf"]

EXTRA: Final = "pip install 'lmcore-registry[gguf]'"
_MAGIC: Final = b"GGUF"


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
