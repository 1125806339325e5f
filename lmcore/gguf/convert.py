"""GGUF files to lmcore checkpoints and back, through the `gguf` package alone.

    lmcore convert --from-gguf FILE.gguf OUT.safetensors    # weights, spec, tokenizer, template
    lmcore convert --to-gguf CKPT OUT.gguf --type q8_0      # for llama.cpp, Ollama, LM Studio

    model = lmcore.gguf.load_gguf("model.gguf")             # the same, in memory
    lmcore.gguf.save_gguf(model, "out.gguf", type="f16")

Every tensor is dequantized to float32 (`lmcore.gguf.reading`), renamed and un-permuted onto
Hugging Face's names (`lmcore.gguf.architectures`), then mapped by the family's own tables, so
a GGUF converts exactly as the Hugging Face directory it was made from. The checkpoint is stored
in float32, or in F16 / BF16 when those hold the file's matrices, unless `dtype` says otherwise;
the tokenizer (`lmcore.gguf.tokenizer`), chat template and special ids are stored with it.

Everything the file says is checked before it is used: its layout (`reading.read_gguf`), its
metadata (`architectures.metadata_to_config`), every tensor's shape against the metadata
(`architectures.check_shapes`, before any tensor is read or un-permuted) and its tokenizer. GGUF
has no checksum, so flipped bits inside a tensor's data cannot be seen (`NO_CHECKSUM`); the
checkpoint written from it carries lmcore's own checksums.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import torch

from lmcore.checkpoint import build_empty, save
from lmcore.errors import ConversionError
from lmcore.gguf.architectures import architecture, family, metadata_to_config, spec_of
from lmcore.gguf.quantized import (
    float_blueprint,
    kept_targets,
    numbered,
    quant_text,
    refused,
    row_sources,
    rows_of,
    thin,
)
from lmcore.gguf.reading import GGUFFile, read_gguf
from lmcore.gguf.rows import Architecture
from lmcore.gguf.tensors import check_shapes, from_gguf_tensors
from lmcore.gguf.tokenizer import from_gguf_metadata
from lmcore.gguf.writing import KEEP, write_gguf
from lmcore.hf.weights import from_hf_state_dict
from lmcore.model.empty import shared_parameters
from lmcore.model.transformer import TransformerLM, unwrap
from lmcore.model.weights import check_finite, load_strict
from lmcore.registry import Registry
from lmcore.sources import load

__all__ = [
    "METADATA_KEY",
    "NO_CHECKSUM",
    "convert_from_gguf",
    "convert_to_gguf",
    "load_gguf",
    "save_gguf",
]

METADATA_KEY: Final = "gguf.metadata"  # checkpoint metadata: the file's own (general.*, ...)
# What `lmcore convert --from-gguf` says once: GGUF has no checksum, the checkpoint has lmcore's.
NO_CHECKSUM: Final = (
    "checksums: a GGUF file has none, so damage inside its tensor data goes unseen (values that "
    "are not finite excepted); {out} carries lmcore's own, verified on every load"
)
_LARGE: Final = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                 "tokenizer.ggml.scores", "tokenizer.chat_template")  # fmt: skip


def _stored_dtype(file: GGUFFile) -> torch.dtype:
    """float16 or bfloat16 when every matrix is stored so, else float32 (what dequantizing
    gives)."""
    kinds = {e.type for e in file.tensors.values() if len(e.shape) > 1}
    return {"F16": torch.float16, "BF16": torch.bfloat16}.get(
        next(iter(kinds)) if len(kinds) == 1 else "", torch.float32
    )


def load_gguf(
    path: str | os.PathLike[str],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    *,
    ignore: Iterable[str] = (),
    keep_quantized: bool = False,
) -> TransformerLM:
    """An lmcore model (with its tokenizer, `model.tokenizer`) from a GGUF file. `ignore`:
    metadata keys lmcore does not know that you know do not change the model.
    `keep_quantized`: Q8_0 / Q4_0 / Q4_1 matrices kept as their blocks (`quant=`,
    `lmcore.gguf.quantized`), not dequantized."""
    if keep_quantized and dtype is not None:
        raise ConversionError("keep_quantized keeps the file's blocks; it takes no dtype")
    model, _ = _load(Path(path), device, dtype, registry, ignore, buffers=True,
                     keep=keep_quantized)  # fmt: skip
    return model


def _load(
    where: Path,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    registry: Registry | None,
    ignore: Iterable[str],
    *,
    buffers: bool,
    keep: bool = False,
) -> tuple[TransformerLM, GGUFFile]:
    """`load_gguf`, and the file it read (its metadata without the vocabulary's lists,
    `_LARGE`). `buffers=False`: a model only to be saved, whose
    buffers outside the state dict are never built (`build_empty`)."""
    file = read_gguf(where)
    arch = architecture(file.architecture, where, file.metadata)
    shapes = {name: e.shape for name, e in file.tensors.items()}
    config = metadata_to_config(file.metadata, shapes, where, ignore=ignore)
    spec = spec_of(config, arch, where)
    check_shapes(arch, config, file.metadata, shapes, where)
    vocab = config.get("vocab_size")
    tokenizer = from_gguf_metadata(
        file.metadata, where, ignore=ignore, vocab_size=vocab if isinstance(vocab, int) else None
    )
    # the vocabulary's lists are the tokenizer's now: not held beside the weights being read
    file = replace(file, metadata={k: v for k, v in file.metadata.items() if k not in _LARGE})
    if keep:
        model, state = _kept(file, arch, config, spec, device, registry, buffers, where)
    else:
        stored = dtype or _stored_dtype(file)
        model = build_empty(spec, device, stored, registry=registry, buffers=buffers)
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        tensors = from_gguf_tensors(file.tensors_float(), arch, config)
        state = from_hf_state_dict(family(arch), tensors, model.blueprint, expected, str(where))
    load_strict(model, state, where, f"the model of {model.spec}")
    check_finite(state, where)
    if tokenizer is not None:
        tokenizer.check_vocab(model.spec.vocab_size, where)
        model.tokenizer = tokenizer
    return model, file


def _kept(
    file: GGUFFile, arch: Architecture, config: dict[str, Any], spec: str,
    device: torch.device | str | None, registry: Registry | None, buffers: bool, where: Path,
) -> tuple[TransformerLM, dict[str, torch.Tensor]]:  # fmt: skip
    """The model of `spec` with the file's quantized matrices kept as their blocks
    (`lmcore.gguf.quantized`), and its state dict: each kept matrix's rows found by sending
    row numbers through the float path, then read as the file's bytes."""
    matrices = {n: e.shape for n, e in file.tensors.items() if len(e.shape) == 2}
    text = quant_text({n: file.tensors[n].type for n in matrices}, where)
    model = build_empty(f"{spec},quant={text}", device, torch.float32, registry=registry,
                        buffers=buffers)  # fmt: skip
    plain = float_blueprint(model.blueprint)
    skeleton = TransformerLM(plain, device="meta")
    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    wanted = kept_targets(skeleton)
    keys = [key for key, *_ in wanted]
    index, starts, names = numbered(matrices)
    floats = {n: file.tensor(n) for n in file.tensors if n not in index}
    tensors = from_gguf_tensors({**floats, **index}, arch, config)
    try:
        aliases = [a for a, owner in shared_parameters(skeleton).items() if owner in keys]
        converted = from_hf_state_dict(family(arch), tensors, plain,
                                       thin(expected, [*keys, *aliases]), str(where))  # fmt: skip
    except ConversionError as e:  # a transposed matrix no longer fits its one-column shape
        raise refused(keys[0] if len(keys) == 1 else "a matrix", where, f": {e}") from None
    sources = row_sources(converted, keys, starts, names, where)
    own = model.state_dict()
    state = {k: v for k, v in converted.items() if k in own}
    fmt = model.blueprint.parts["quant"]
    users: dict[str, list[tuple[str, int, int, str]]] = {}  # a file tensor -> the matrices of it
    for key, n, k, role in wanted:
        users.setdefault(sources[key][0], []).append((key, n, k, role))
    for name, matrices in users.items():  # one tensor's bytes read at a time
        raw = file.raw(name)
        for key, n, k, role in matrices:
            child = fmt.create(in_features=k, out_features=n, role=role, device="meta")
            try:
                child.from_ggml(file.tensors[name].type, rows_of(raw, sources[key][1]))
            except ValueError as e:
                raise ConversionError(f"{where}: tensor {name}: {e}") from None
            prefix = key.removesuffix("weight") + "quant."
            state.update({prefix + p: t.data for p, t in child.named_parameters()})
        del raw
    for alias, owner in shared_parameters(model).items():  # a tied head: the embedding's
        state[alias] = state[owner]
    return model, state


def convert_from_gguf(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    ignore: Iterable[str] = (),
    keep_quantized: bool = False,
) -> Path:
    """`lmcore convert --from-gguf FILE OUT`: a GGUF file to an lmcore checkpoint holding the
    model, its tokenizer and chat template, and the file's own metadata (`gguf.metadata`:
    general.*, the architecture's keys). Only the weights are built: memory follows the file,
    not the context length its metadata names (RoPE's tables are never computed).
    `keep_quantized`: as `load_gguf`'s."""
    if keep_quantized and dtype is not None:
        raise ConversionError("--keep-quantized keeps the file's blocks; it takes no --dtype")
    model, file = _load(Path(path), None, dtype, registry, ignore, buffers=False,
                        keep=keep_quantized)  # fmt: skip
    kept = {k: v for k, v in file.metadata.items() if k not in _LARGE}
    return save(model, out, metadata={METADATA_KEY: json.dumps(kept, sort_keys=True)})


def save_gguf(
    model: torch.nn.Module,
    path: str | os.PathLike[str],
    *,
    type: str = KEEP,
    architecture: str | None = None,
) -> Path:
    """Write `model` (a `TransformerLM`) and its tokenizer as a GGUF file (`write_gguf`):
    as `architecture`, else the first GGUF architecture that holds the model."""
    return write_gguf(unwrap(model), path, type=type, architecture=architecture)


def convert_to_gguf(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    type: str = KEEP,
    architecture: str | None = None,
) -> Path:
    """`lmcore convert --to-gguf CKPT OUT`: an lmcore checkpoint (and its tokenizer) to GGUF,
    as `architecture`, else as the architecture of the Hugging Face family or GGUF file it was
    converted from when that holds it (a Phi-3 as `phi3`, not `llama`), else the first that
    does."""
    if Path(out).resolve() == Path(checkpoint).resolve():
        raise ConversionError(f"{out}: is the checkpoint being converted; choose another OUT")
    return write_gguf(
        load(checkpoint), out, type=type, architecture=architecture, prefer=_origin(checkpoint)
    )


def _origin(checkpoint: str | os.PathLike[str]) -> str | None:
    """The model_type (`hf.config`) or GGUF architecture (`gguf.metadata`) a checkpoint was
    converted from, if it says."""
    from lmcore.checkpoint import read_info

    try:
        metadata = read_info(checkpoint).metadata
    except (ConversionError, OSError, ValueError):
        return None  # not a checkpoint file: `load` says why
    for key, field in (("hf.config", "model_type"), (METADATA_KEY, "general.architecture")):
        try:
            found = json.loads(metadata.get(key, "{}"))
        except json.JSONDecodeError:
            continue
        if isinstance(found, dict) and isinstance(found.get(field), str):
            return str(found[field])
    return None
