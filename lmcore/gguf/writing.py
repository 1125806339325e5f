"""Writing an lmcore model as a GGUF file that llama.cpp-family tools load (`--to-gguf`).

The model goes through its Hugging Face family's tables first (`spec_to_config` refuses what
the family cannot express: another norm, FFN or positional encoding, post-norm blocks, ...),
then the GGUF architecture's (`lmcore.gguf.architectures`): metadata keys, tensor names, and q/k
rows in llama.cpp's interleaved layout. Weights are stored as `TYPES` says; one-dimensional
tensors (the norms' gains) stay F32, as llama.cpp expects, and a matrix whose rows do not split
into Q8_0's 32-value blocks is stored F16. The tokenizer, when the checkpoint has one, is written
as `tokenizer.ggml.*` (`lmcore.gguf.tokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from torch import Tensor

from lmcore.atomic import atomic_path
from lmcore.errors import ConversionError, one_of
from lmcore.gguf.architectures import ARCHITECTURES, config_to_metadata, family, to_gguf_tensors
from lmcore.gguf.reading import import_gguf
from lmcore.gguf.tokenizer import to_gguf_metadata
from lmcore.hf.family import spec_to_config
from lmcore.hf.weights import to_hf_state_dict
from lmcore.model.transformer import TransformerLM
from lmcore.tokenizer import SavedTokenizer
from lmcore.version import __version__

__all__ = ["TYPES", "write_gguf"]

# --type -> (GGML type of the matrices, general.file_type)
TYPES: Final[Mapping[str, tuple[str, int]]] = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
}


def write_gguf(
    model: TransformerLM,
    path: str | os.PathLike[str],
    *,
    type: str = "f32",
    tokenizer: SavedTokenizer | None = None,
    name: str | None = None,
) -> Path:
    """Write `model` (and `tokenizer`, default: the model's own) to one GGUF file,
    atomically. `type`: how the matrices are stored, one of `TYPES`."""
    gguf = import_gguf()
    if type not in TYPES:
        raise ConversionError(f"--type {type!r}: GGUF types lmcore writes are {one_of(TYPES)}")
    arch = ARCHITECTURES["llama"]
    fam = family(arch)
    config = spec_to_config(model.blueprint, model.lm_head.weight.dtype, family=fam)
    state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    tensors = to_gguf_tensors(to_hf_state_dict(fam, state, model.blueprint), arch, config)
    matrix_type, file_type = TYPES[type]
    out = Path(path)
    with atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch.name)
        writer.add_type("model")
        writer.add_name(name or out.stem)
        writer.add_file_type(file_type)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_string("general.source.url", f"lmcore {__version__}: {model.spec}")
        for key, value in config_to_metadata(config, arch).items():
            _add(writer, key, value)
        saved = tokenizer or model.tokenizer
        if saved is not None:
            for key, value in to_gguf_metadata(saved, model.spec.vocab_size).items():
                _add(writer, key, value)
        for tensor_name, t in tensors.items():
            qtype = matrix_type if t.dim() > 1 else "F32"
            if qtype == "Q8_0" and t.shape[-1] % 32:
                qtype = "F16"
            raw = gguf.quants.quantize(_numpy(t), gguf.GGMLQuantizationType[qtype])
            writer.add_tensor(
                tensor_name,
                raw,
                raw_dtype=None if qtype in ("F32", "F16") else gguf.GGMLQuantizationType[qtype],
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out


def _numpy(t: Tensor) -> Any:
    return np.ascontiguousarray(t.numpy(), dtype=np.float32)


def _add(writer: Any, key: str, value: Any) -> None:
    """A metadata entry in GGUF's type for it: bool, uint32, float32, string, or an array."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:  # pragma: no cover - the tables hold these types only
        raise ConversionError(
            f"GGUF metadata {key}: a {type(value).__name__}, not a bool, int, float, str or list"
        )
