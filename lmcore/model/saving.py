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
    anything else           the caller's `metadata=`, e.g. a trainer's step count
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch
from safetensors.torch import save_file
from torch import Tensor

from lmcore.atomic import atomic_path
from lmcore.blueprint import Blueprint, Part
from lmcore.components import KINDS
from lmcore.errors import CheckpointError
from lmcore.version import __version__

__all__ = ["FORMAT_VERSION", "KEYS", "PREFIX", "SUFFIX", "dtype_of", "store_once", "write"]

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
}
SUFFIX: Final = ".safetensors"


def write(
    path: str | os.PathLike[str],
    blueprint: Blueprint,
    state: Mapping[str, Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write a model's `state` (its `state_dict()`) and everything needed to rebuild it from
    `blueprint` to one safetensors file, atomically.

    `metadata` adds the caller's own string entries (e.g. a trainer's step); names starting with
    "lmcore." and "format" are lmcore's. Shared parameters (tied embeddings) are stored once.
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
        if part is not bp.parts.get(part.kind) and key not in components:
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
    dest = Path(path)
    with atomic_path(dest) as tmp:
        save_file(tensors, tmp, metadata=header)
    return dest


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
    """The floating dtype holding most of the elements ("float32" when there is none)."""
    counts: Counter[torch.dtype] = Counter()
    for t in tensors.values():
        if t.is_floating_point():
            counts[t.dtype] += t.numel()
    dtype = counts.most_common(1)[0][0] if counts else torch.float32
    return str(dtype).removeprefix("torch.")
