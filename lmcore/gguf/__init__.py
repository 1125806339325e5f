"""GGUF interop: llama.cpp's files to lmcore checkpoints and back (`lmcore convert --from-gguf`,
`--to-gguf`), through the `gguf` package (the `gguf` extra).

    from lmcore.gguf import convert_from_gguf, convert_to_gguf, load_gguf, save_gguf

One module per concern: `reading.py` (metadata, dequantizing), `architectures.py` (GGUF names
onto the Hugging Face families' tables), `tokenizer.py` (`tokenizer.ggml.*` <-> tokenizer.json),
`writing.py` (a model to GGUF), `convert.py` (the files). Names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcore.gguf.architectures import ARCHITECTURES
    from lmcore.gguf.convert import convert_from_gguf, convert_to_gguf, load_gguf, save_gguf
    from lmcore.gguf.reading import read_gguf
    from lmcore.gguf.writing import TYPES

_WHERE = {
    "ARCHITECTURES": "architectures",
    "TYPES": "writing",
    "convert_from_gguf": "convert",
    "convert_to_gguf": "convert",
    "load_gguf": "convert",
    "read_gguf": "reading",
    "save_gguf": "convert",
}

__all__ = [
    "ARCHITECTURES",
    "TYPES",
    "convert_from_gguf",
    "convert_to_gguf",
    "load_gguf",
    "read_gguf",
    "save_gguf",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lmcore.gguf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lmcore.gguf.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *_WHERE]
