"""GGUF interop: llama.cpp's files to lmcore checkpoints and back (`lmcore convert --from-gguf`,
`--to-gguf`), through the `gguf` package (the `gguf` extra).

    from lmcore.gguf import convert_from_gguf, convert_to_gguf, load_gguf, save_gguf

One module per concern: `reading.py` (metadata, dequantizing), `architectures.py` (GGUF metadata
onto the Hugging Face families' tables), `tensors.py` (shapes checked, llama.cpp's tensor
changes undone and redone), `tokenizer.py` (`tokenizer.ggml.*` <-> tokenizer.json),
`writing.py` (a model to GGUF), `convert.py` (the files). Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcore.lazy import attach

if TYPE_CHECKING:
    from lmcore.gguf.architectures import ARCHITECTURES as ARCHITECTURES
    from lmcore.gguf.convert import convert_from_gguf as convert_from_gguf
    from lmcore.gguf.convert import convert_to_gguf as convert_to_gguf
    from lmcore.gguf.convert import load_gguf as load_gguf
    from lmcore.gguf.convert import save_gguf as save_gguf
    from lmcore.gguf.reading import read_gguf as read_gguf
    from lmcore.gguf.writing import TYPES as TYPES

__getattr__, __dir__ = attach(__name__)
