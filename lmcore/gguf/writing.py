"""Writing an lmcore model as a GGUF file that llama.cpp-family tools load (`--to-gguf`).

The architecture is the first of `WRITE_ORDER` (llama, qwen2, qwen3, gemma, gemma2, olmo2,
phi3, gpt2, gptneox, llama with experts, qwen3moe) whose Hugging Face family expresses the model
(`spec_to_config`) and whose metadata reads back as the same model (`writable`), the one the
model came from tried first; `architecture=` names one. The model goes through that family's
tables, then the GGUF architecture's (`lmcore.gguf.architectures`): metadata keys, tensor names,
and the tensors changed as llama.cpp's converter changes them (q/k rows interleaved, Gemma's
norm gains + 1, experts stacked, ...). Weights are stored as `TYPES` says; one-dimensional
tensors (the norms' gains) stay F32, as llama.cpp expects, and a matrix whose rows do not split
into Q8_0's 32-value blocks is stored F16. The tokenizer, when the checkpoint has one, is written
as `tokenizer.ggml.*` (`lmcore.gguf.tokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import numpy as np
import torch
from torch import Tensor

from lmcore.atomic import atomic_path
from lmcore.errors import ConversionError, one_of
from lmcore.gguf.architectures import (
    ARCHITECTURES,
    BY_MODEL_TYPE,
    WRITE_ORDER,
    Architecture,
    family,
    writable,
)
from lmcore.gguf.quantized import FILE_TYPES, float_blueprint, numbered, row_sources
from lmcore.gguf.reading import import_gguf
from lmcore.gguf.tensors import to_gguf_tensors
from lmcore.gguf.tokenizer import to_gguf_metadata
from lmcore.hf.family import spec_to_config
from lmcore.hf.weights import to_hf_state_dict
from lmcore.model.quant import quantized, stored
from lmcore.model.transformer import TransformerLM
from lmcore.tokenizer import SavedTokenizer
from lmcore.version import __version__

__all__ = ["KEEP", "TYPES", "choose", "write_gguf"]

# --type -> (GGML type of the matrices, general.file_type)
TYPES: Final[Mapping[str, tuple[str, int]]] = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
}


# --type for a quantized model: its formats' blocks as they are (the default for one).
KEEP: Final = "kept"


def write_gguf(
    model: TransformerLM,
    path: str | os.PathLike[str],
    *,
    type: str = KEEP,
    tokenizer: SavedTokenizer | None = None,
    name: str | None = None,
    architecture: str | None = None,
    prefer: str | None = None,
) -> Path:
    """Write `model` (and `tokenizer`, default: the model's own) to one GGUF file,
    atomically. `type`: how the matrices are stored, one of `TYPES`, or `KEEP` (the default):
    a quantized model's blocks as they are (`lmcore.gguf.quantized`), a float model's F32;
    `architecture`: the GGUF architecture to write (default: the first of `WRITE_ORDER` that
    holds the model, trying first the one of `prefer`, a Hugging Face model_type or GGUF
    architecture the model came from)."""
    gguf = import_gguf()
    if type not in TYPES and type != KEEP:
        raise ConversionError(f"--type {type!r}: GGUF types lmcore writes are {one_of(TYPES)}")
    if type == KEEP and not quantized(model):
        type = "f32"  # a float model: its own dtype is not a GGML block type; f32 as before
    kept: dict[str, tuple[str, Tensor]] = {}
    if quantized(model):
        tensors, kept, file_type = _quantized_tensors(model, type, architecture, prefer)
        arch, config, metadata = choose(_plain(model), architecture, prefer)
        matrix_type = "F32" if type == KEEP else TYPES[type][0]  # kept: only the norms left
    else:
        arch, config, metadata = choose(model, architecture, prefer)
        fam = family(arch)
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
        for key, value in metadata.items():
            if not key.startswith("general."):
                _add(writer, key, value)
        saved = tokenizer or model.tokenizer
        if saved is not None:
            for key, value in to_gguf_metadata(saved, model.spec.vocab_size).items():
                _add(writer, key, value)
        for tensor_name, (kind, raw) in kept.items():  # a kept format's blocks, as they are
            writer.add_tensor(tensor_name, raw.numpy(), raw_dtype=gguf.GGMLQuantizationType[kind])
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


def _plain(model: TransformerLM) -> Any:
    """A stand-in for `choose`: the quantized model's float blueprint, its dtype (float32)."""
    return SimpleNamespace(blueprint=float_blueprint(model.blueprint),
                           lm_head=SimpleNamespace(weight=model.lm_head.weight))  # fmt: skip


def _quantized_tensors(
    model: TransformerLM, type: str, architecture: str | None, prefer: str | None
) -> tuple[dict[str, Tensor], dict[str, tuple[str, Tensor]], int]:
    """A quantized model's GGUF tensors: the float ones (norms, biases; or every matrix
    dequantized, when `type` names a GGML type to write instead), and each kept matrix's
    blocks under its GGUF name, the rows found by sending row numbers through the float path
    (`lmcore.gguf.quantized`); and general.file_type."""
    arch, config, _ = choose(_plain(model), architecture, prefer)
    fam, plain = family(arch), float_blueprint(model.blueprint)
    formats: dict[str, Any] = dict(stored(model))
    state: dict[str, Tensor] = {}
    for key, v in model.state_dict().items():
        if ".quant." not in f".{key}":
            state[key] = v.detach().to("cpu", torch.float32)
    aliases = _aliases(model, formats)
    if type != KEEP:  # every matrix dequantized, then written as `type` says
        for name, child in formats.items():
            for key in [f"{name}.weight", *aliases.get(name, [])]:
                state[key] = child.dequantize().cpu()
        tensors = to_gguf_tensors(to_hf_state_dict(fam, state, plain), arch, config)
        return tensors, {}, TYPES[type][1]
    shapes = {f"{n}.weight": (c.out_features, c.in_features) for n, c in formats.items()}
    index, starts, names = numbered(shapes)
    for name in formats:
        for alias in aliases.get(name, []):
            index[alias] = index[f"{name}.weight"]
    tensors = to_gguf_tensors(to_hf_state_dict(fam, {**state, **index}, plain), arch, config)
    matrices = [k for k, t in tensors.items() if t.dtype == torch.int64]
    sources = row_sources(tensors, matrices, starts, names, "this model")
    kept: dict[str, tuple[str, Tensor]] = {}
    kinds = set()
    for gguf_name, (key, rows) in sources.items():
        child = formats[key.removesuffix(".weight")]
        to_ggml = getattr(child, "to_ggml", None)
        if to_ggml is None:
            raise ConversionError(
                f"{key} is stored {getattr(child, 'name', child.__class__.__name__)}, which has no "
                f"GGUF type; pass --type ({one_of(TYPES)}): q8_0 rounds it again per 32 weights"
            )
        kind, raw = to_ggml()
        kept[gguf_name] = (kind, raw.cpu()[rows])
        kinds.add(kind)
    rest = {k: t for k, t in tensors.items() if k not in kept}
    main = max(kinds, key=lambda k: sum(1 for v in kept.values() if v[0] == k))
    return rest, kept, FILE_TYPES[main]


def _aliases(model: TransformerLM, formats: Mapping[str, Any]) -> dict[str, list[str]]:
    """The state-dict keys of the matrices that share a kept one's format (a tied head)."""
    out: dict[str, list[str]] = {}
    owners = {id(c): n for n, c in formats.items()}
    for name, m in model.named_modules():
        child = getattr(m, "_modules", {}).get("quant")
        if child is not None and name not in formats and id(child) in owners:
            out.setdefault(owners[id(child)], []).append(f"{name}.weight")
    return out


def choose(
    model: TransformerLM, architecture: str | None = None, prefer: str | None = None
) -> tuple[Architecture, dict[str, Any], dict[str, Any]]:
    """The GGUF architecture `model` is written as, its family's config and its metadata; or
    `ConversionError` naming what the closest architecture cannot hold."""
    first: Architecture | None = None
    if architecture is not None:
        candidates = [a for a in WRITE_ORDER if a.name == architecture]
        if not candidates:
            names = one_of(a.name for a in WRITE_ORDER)
            raise ConversionError(f"GGUF architecture {architecture!r}: lmcore writes {names}")
    else:
        first = BY_MODEL_TYPE.get(prefer or "") or ARCHITECTURES.get(prefer or "")
        candidates = [*([first] if first else []), *(a for a in WRITE_ORDER if a is not first)]
    bp = model.blueprint
    dtype = model.lm_head.weight.dtype
    tried: list[tuple[int, int, str, list[str]]] = []
    for rank, arch in enumerate(candidates):
        try:
            config = spec_to_config(bp, dtype, family=family(arch))
        except ConversionError as e:
            said = str(e).partition("without losing something: ")[2] or str(e)
            lost = [said.removesuffix(f" (spec: {bp.spec})")]  # said once, at the end
        else:
            metadata, lost = writable(bp, config, arch)
            chosen = architecture is not None or (rank == 0 and first is arch)
            unused = [
                f"{name}={config[name]}: {why}; pass architecture={arch.name!r} to write it anyway"
                for name, why in arch.unused.items()
                if config.get(name) and not chosen
            ]
            if not lost and not unused:
                return arch, config, metadata
            if not lost:  # it holds the model, but llama.cpp would not run all of it: said first
                tried.append((0, rank, arch.name, unused))
                continue
        label = arch.name if arch.family == arch.name else f"{arch.name} ({arch.family})"
        tried.append((sum(x.count("; ") + 1 for x in lost), rank, label, lost))
    tried.sort()
    # the closest, those as close, and the architecture of the model's own Hugging Face family
    own = _own_architecture(bp, dtype)
    shown = [t for t in tried if t[0] == tried[0][0] or t[2].split(" ")[0] == own][:3]
    said = "; ".join(f"as {label}: " + "; ".join(lost) for _, _, label, lost in shown)
    raise ConversionError(
        f"cannot write this model as GGUF without losing something ({said}) (spec: {bp.spec})"
    )


def _own_architecture(bp: Any, dtype: Any) -> str | None:
    """The GGUF architecture of the first Hugging Face family that expresses the model."""
    try:
        model_type = spec_to_config(bp, dtype)["model_type"]
    except ConversionError:
        return None
    arch = BY_MODEL_TYPE.get(model_type)
    return None if arch is None else arch.name


# Metadata llama.cpp reads as float32 (a config may hold them as integers: rope_theta 10000).
_FLOAT_KEYS: Final = ("freq_base", "epsilon", "softcapping", "factor")


def _numpy(t: Tensor) -> Any:
    return np.ascontiguousarray(t.numpy(), dtype=np.float32)


def _add(writer: Any, key: str, value: Any) -> None:
    """A metadata entry in GGUF's type for it: bool, uint32, float32, string, or an array."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif key.endswith(_FLOAT_KEYS) and isinstance(value, int):
        writer.add_float32(key, float(value))  # llama.cpp reads these as float32 only
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
