"""The checkpoint file's writer: one safetensors file that remembers the spec and the plugins
that built the model. `TransformerLM.save` and `lmcore.save` write through here; the reader
(`lmcore.load`, `read_info`) is `lmcore.checkpoint`, above the model.

The file's string metadata says how to rebuild the model:

    format                  "pt", safetensors' own convention
    lmcore.format_version   "1" (`FORMAT_VERSION`); a newer file is refused with "upgrade lmcore"
    lmcore.spec             the canonical spec string
    lmcore.components       JSON, per kind: {name, dist, version, plugin, module} of the provider
    lmcore.lmcore_version   the lmcore that wrote it
    lmcore.torch_version    the torch that wrote it
    lmcore.dtype            the model's dtype, e.g. "float32"; `load` keeps it unless told otherwise
    lmcore.tied             JSON {alias: stored name}, when parameters are shared (tied embeddings)
    lmcore.checksums        JSON {"algorithm": "crc32", "tensors": {name: 8 hex digits}}: the CRC-32
                            (zlib.crc32) of each stored tensor's bytes, as they lie in the file;
                            "metadata": {key: 8 hex digits} of the tokenizer's entries (UTF-8)
    lmcore.adapter_base     JSON {path, relative, spec, checksum}, in a file holding an adapter's
                            weights only: the base checkpoint they apply to (its path, also
                            relative to this file's folder, its spec, and the CRC-32 of its
                            `lmcore.checksums` table, `base_identity`); `lmcore.load` loads
                            the base, checks it is that one, and applies the adapter
    lmcore.tokenizer        the model's tokenizer.json, when it was saved with one
    lmcore.tokenizer_config JSON: its special token ids, stop ids and chat template
    anything else           the caller's `metadata=`, e.g. a trainer's step count

`lmcore.load` verifies the checksums by default (`lmcore.model.reading.verify_checksums`), so that
flipped bytes, tensors whose offsets were swapped and data of the wrong tensor are refused,
naming the tensor. CRC-32 detects accidental damage (a bad disk or copy), not a deliberate
edit: whoever can change the bytes can change the metadata too. It costs about as much as
copying the bytes once. Files written before checksums were added have no `lmcore.checksums`
and load as before, with nothing to verify; readers that predate the key ignore it (it is one
more `lmcore.*` string), so the format version stays 1.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import Tensor

from lmcore.atomic import atomic_path
from lmcore.blueprint import Blueprint, Part
from lmcore.components import KINDS
from lmcore.errors import CheckpointError
from lmcore.tokenizer import SavedTokenizer
from lmcore.version import __version__

__all__ = [
    "CHECKSUM",
    "FORMAT_VERSION",
    "KEYS",
    "PREFIX",
    "SUFFIX",
    "checksum",
    "checksums_json",
    "dtype_of",
    "save_tensors",
    "store_once",
    "tensor_bytes",
    "write",
]

FORMAT_VERSION: Final = 1
PREFIX: Final = "lmcore."
KEYS: Final = {
    "format_version": "lmcore.format_version",
    "spec": "lmcore.spec",
    "components": "lmcore.components",
    "lmcore_version": "lmcore.lmcore_version",
    "torch_version": "lmcore.torch_version",
    "dtype": "lmcore.dtype",
    "tied": "lmcore.tied",
    "checksums": "lmcore.checksums",
    "base": "lmcore.adapter_base",
}
CHECKSUM: Final = "crc32"  # the algorithm `lmcore.checksums` names
SUFFIX: Final = ".safetensors"


def write(
    path: str | os.PathLike[str],
    blueprint: Blueprint,
    state: Mapping[str, Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
    tokenizer: SavedTokenizer | None = None,
    base: Mapping[str, str] | None = None,
) -> Path:
    """Write a model's `state` (its `state_dict()`) and everything needed to rebuild it from
    `blueprint` to one safetensors file, atomically. `base`: `state` is an adapter's alone and
    applies to that base checkpoint (`lmcore.adapter_base`).

    `metadata` adds the caller's own string entries (e.g. a trainer's step); names starting with
    "lmcore." and "format" are lmcore's. `tokenizer`: the model's own, stored in the metadata
    and covered by the checksums. Shared parameters (tied embeddings) are stored once.
    Returns the path written.
    """
    extra = dict(metadata or {})
    for key, value in extra.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise CheckpointError(
                f"metadata must map strings to strings (safetensors stores strings only); got "
                f"{key!r}: {type(value).__name__}; convert the value, e.g. with str() or "
                "json.dumps()"
            )
        if key.startswith(PREFIX) or key == "format":
            raise CheckpointError(
                f"metadata key {key!r} is reserved for lmcore (its keys are 'format' and "
                f"'{PREFIX}*'); choose another name, e.g. 'train.{key.removeprefix(PREFIX)}'"
            )
    tensors, tied = store_once(state)
    bp = blueprint

    def row(part: Part) -> dict[str, str | None]:
        where = part.provenance
        return {"name": part.name, "dist": where.dist, "version": where.version,
                "plugin": where.plugin, "module": where.module}  # fmt: skip

    # One row per kind (the whole model's), then one per other component it uses (a qk_norm,
    # a layer's own, a nested one), under "kind name" with its kind.
    components: dict[str, dict[str, str | None]] = {kind: row(bp.parts[kind]) for kind in KINDS}
    for _, part in bp.used():
        key = f"{part.kind} {part.name}"
        own = part.kind in KINDS and part is bp.parts.get(part.kind)  # its kind's row already
        if not own and key not in components:
            components[key] = {**row(part), "kind": part.kind}
    header = {
        **extra,
        "format": "pt",
        KEYS["format_version"]: str(FORMAT_VERSION),
        KEYS["spec"]: str(bp.spec),
        KEYS["components"]: json.dumps(components, sort_keys=True),
        KEYS["lmcore_version"]: __version__,
        KEYS["torch_version"]: torch.__version__,
        KEYS["dtype"]: dtype_of(tensors),
    }
    if tied:
        header[KEYS["tied"]] = json.dumps(tied, sort_keys=True)
    if base is not None:
        header[KEYS["base"]] = json.dumps(dict(base), sort_keys=True)
    own = tokenizer.to_metadata() if tokenizer is not None else {}
    header.update(own)
    header[KEYS["checksums"]] = checksums_json(tensors, own)
    dest = Path(path)
    if dest.is_dir():
        raise CheckpointError(
            f"{dest}: is a directory; save to a file, e.g. {dest / ('model' + SUFFIX)}"
        )
    with atomic_path(dest) as tmp:
        save_tensors(tensors, tmp, header, dest)
    return dest


def save_tensors(
    tensors: Mapping[str, Tensor], tmp: Path, metadata: Mapping[str, str], dest: Path
) -> None:
    """`safetensors.torch.save_file` into `tmp` (which will become `dest`). A write the system
    refuses (a full disk, ...) raises `OSError` naming `dest`, as Python's own writes do, not
    safetensors' error naming nothing."""
    try:
        save_file(dict(tensors), tmp, metadata=dict(metadata))
    except SafetensorError as e:
        found = re.search(r"os error (\d+)", str(e))
        if found is None:
            raise CheckpointError(f"{dest}: cannot be written: {e}") from None
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(dest)) from None


def checksum(data: Any) -> str:
    """The CRC-32 of a buffer's bytes, as 8 hex digits."""
    return f"{zlib.crc32(data):08x}"


def tensor_bytes(t: Tensor) -> Any:
    """A CPU tensor's bytes as safetensors writes them (contiguous, little-endian), no copy
    when it is contiguous already."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def checksums_json(tensors: Mapping[str, Tensor], metadata: Mapping[str, str] | None = None) -> str:
    """`lmcore.checksums` for these tensors (and these metadata entries, as UTF-8)."""
    sums = {name: checksum(tensor_bytes(t)) for name, t in tensors.items()}
    table: dict[str, Any] = {"algorithm": CHECKSUM, "tensors": sums}
    if metadata:
        table["metadata"] = {k: checksum(v.encode("utf-8")) for k, v in metadata.items()}
    return json.dumps(table, sort_keys=True)


def store_once(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """CPU tensors to write, each storage once, and {alias: stored name} for shared tensors."""
    tensors: dict[str, Tensor] = {}
    tied: dict[str, str] = {}
    first: dict[tuple[Any, ...], str] = {}
    storages: set[tuple[str, int]] = set()
    for name, t in state.items():
        if t.is_meta:
            raise CheckpointError(
                f"cannot save {name}: the model was built on the meta device, which holds shapes "
                "but no weights; build it on cpu or cuda"
            )
        t = t.detach()
        if t.numel():
            same = (str(t.device), t.dtype, t.data_ptr(), tuple(t.shape), t.stride())
            if same in first:  # the very same tensor under a second name: store it once
                tied[name] = first[same]
                continue
            first[same] = name
            storage = (str(t.device), t.untyped_storage().data_ptr())
            whole = t.is_contiguous() and t.untyped_storage().nbytes() == t.nbytes
            if storage in storages or not whole:  # a view into a larger (e.g. fused) weight
                t = t.contiguous().clone()
            storages.add(storage)
        tensors[name] = t.cpu()
    return tensors, tied


def dtype_of(tensors: Mapping[str, Tensor]) -> str:
    """The floating dtype holding most of the elements ("float32" when there is none); a
    weight format's tensors (``….quant.*``, `lmcore.model.quant`) keep their own dtypes and
    do not count."""
    counts: Counter[torch.dtype] = Counter()
    for key, t in tensors.items():
        if t.is_floating_point() and ".quant." not in f".{key}":
            counts[t.dtype] += t.numel()
    dtype = counts.most_common(1)[0][0] if counts else torch.float32
    return str(dtype).removeprefix("torch.")
