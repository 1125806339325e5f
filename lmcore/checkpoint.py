"""Checkpoints: one safetensors file that remembers the spec and the plugins that built the model.

    lmcore.save(model, "m.safetensors")               # or model.save("m.safetensors")
    model = lmcore.load("m.safetensors")              # rebuilt from the embedded spec, strictly
    model = lmcore.load("runs/quickstart")            # a run directory: its newest checkpoint
    info = lmcore.checkpoint.read_info("m.safetensors")  # the header alone: spec, provenance, ...
    tiny = lmcore.load_state_dict_file("ts_state_dict.pt", "cs336-tiny")  # CS336 state dicts

A checkpoint is a plain safetensors file (weights only, no pickle) whose string metadata says how
to rebuild the model (`lmcore.model.saving` writes it and lists the keys). `lmcore.load`
(`lmcore.sources`) takes the file, a checkpoint directory holding `model.safetensors`, or a run
directory of `lmcore train` (its newest checkpoint, `checkpoints/step-NNNNNN/`):
`lmcore.runfiles.find_checkpoint` says which file that is; this module reads the file
(`read_info`), resolves its spec (`resolve_checkpoint`) and loads its weights
(`build_from_checkpoint`, `load_weights`).

Loading re-resolves the spec through the registry. A component whose plugin is missing names the
distribution to install; one installed at another version loads with a `CheckpointWarning` (an
error under `LMCORE_STRICT_PLUGINS`). Tensors are checked by name and shape against the rebuilt
model and every mismatch is listed (`lmcore.model.weights`). The header is parsed here, not by
safetensors, so a damaged file gets a message that says what is wrong with it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn

from lmcore.blueprint import Blueprint, resolve
from lmcore.components import ADAPTER_KINDS, KINDS, PARAMETRIZATION_KINDS, WEIGHT_KINDS
from lmcore.errors import CheckpointError, CheckpointWarning, RegistryError, SpecError, clip
from lmcore.model.empty import parameters_on_meta, shared_parameters
from lmcore.model.inputs import check_device
from lmcore.model.reading import (
    Header,
    TensorInfo,
    load_json,
    read_header,
    read_tensors,
    verify_checksums,
    verify_metadata,
)
from lmcore.model.saving import FORMAT_VERSION, KEYS, PREFIX, SUFFIX, checksum, dtype_of
from lmcore.model.transformer import TransformerLM, unwrap
from lmcore.model.weights import check_dtypes, check_finite, device_of, load_strict
from lmcore.registry import Entry, Registry, get_registry, normalize_dist
from lmcore.runfiles import CHECKPOINTS, MODEL_FILE, RUN_FILE, find_checkpoint, step_dirs
from lmcore.spec import SLOTS, ModelSpec, parse_items
from lmcore.tokenizer import SavedTokenizer

__all__ = [
    "CHECKPOINTS",
    "FORMAT_VERSION",
    "MODEL_FILE",
    "RUN_FILE",
    "CheckpointInfo",
    "Header",
    "SavedComponent",
    "TensorInfo",
    "build_from_checkpoint",
    "check_dtypes",
    "check_finite",
    "find_checkpoint",
    "load_state_dict_file",
    "load_weights",
    "read_header",
    "read_info",
    "resolve_checkpoint",
    "save",
    "step_dirs",
    "verify_checksums",
]

_MAX_NAME: Final = 200  # characters of a name or version lmcore's metadata may hold


# ------------------------------------------------------------------------------ lmcore's metadata


@dataclass(frozen=True)
class SavedComponent:
    """The provider of one component when the checkpoint was saved."""

    kind: str
    name: str
    plugin: str  # entry-point name (or the name given to Registry.register)
    module: str
    dist: str | None  # None: registered in-process, no distribution
    version: str | None

    @property
    def requirement(self) -> str | None:
        """What to install to get it back, e.g. "lmcore-dyt==0.1.0"."""
        if self.dist is None:
            return None
        return self.dist if self.version in (None, "?") else f"{self.dist}=={self.version}"

    def __str__(self) -> str:
        where = f"{self.dist} {self.version}" if self.dist else "registered in-process"
        return f"{where} (entry point {self.plugin!r}, module {self.module})"


@dataclass(frozen=True)
class CheckpointInfo:
    """What an lmcore checkpoint says about itself; `read_info` reads it without the weights."""

    path: Path
    format_version: int
    spec: str  # canonical, as saved
    # By kind (the whole model's; a checkpoint older than the block kind has no "block"),
    # then "kind name" for every other component the model uses.
    components: Mapping[str, SavedComponent]
    lmcore_version: str
    torch_version: str
    dtype: str  # e.g. "float32"
    tied: Mapping[str, str]  # alias -> the name its tensor is stored under
    metadata: Mapping[str, str]  # the caller's own keys (everything outside lmcore.*)
    tensors: Mapping[str, TensorInfo]  # as stored: a tied alias is not among them
    size: int  # bytes
    checksums: Mapping[str, str] | None = None  # CRC-32 per stored tensor; None: saved without
    data_start: int = 0  # the byte where the tensors' data begins
    tokenizer: SavedTokenizer | None = None  # the model's own, when it was saved with one
    # An adapter's weights alone: the base checkpoint they apply to (`lmcore.adapter_base`).
    base: Mapping[str, str] | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return _dtype(self.dtype, self.path)


def read_info(path: str | os.PathLike[str]) -> CheckpointInfo:
    """The spec, provenance, versions, dtype and caller metadata of an lmcore checkpoint, read
    from its header alone (no tensor data is read, no plugin is loaded)."""
    header = read_header(path)
    p, meta = header.path, header.metadata
    if KEYS["spec"] not in meta:
        shown = ", ".join(sorted(meta)) or "none"
        raise CheckpointError(
            f"{p}: is a safetensors file but not an lmcore checkpoint: its metadata has no "
            f"{KEYS['spec']!r} (metadata keys: {shown}). For a CS336-keyed state dict use "
            "lmcore.load_state_dict_file(path, spec); for a Hugging Face model directory, "
            "`lmcore convert --from-hf DIR OUT.safetensors`"
        )

    def bad(key: str, problem: str) -> CheckpointError:
        return CheckpointError(
            f"{p}: has damaged lmcore metadata: {key} {problem}; the file was edited or damaged "
            "after lmcore saved it"
        )

    raw_version = meta.get(KEYS["format_version"], "")
    if not raw_version.isdigit():
        raise bad(KEYS["format_version"], f"is {raw_version!r}, not a number")
    version = int(raw_version)
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{p}: was written in lmcore checkpoint format {version} by lmcore "
            f"{meta.get(KEYS['lmcore_version'], '?')}; this lmcore reads format "
            f"{FORMAT_VERSION} and older: upgrade it (pip install -U lmcore-registry)"
        )
    components: dict[str, SavedComponent] = {}
    try:
        table = load_json(meta.get(KEYS["components"], ""))
        for kind in ("norm", "ffn", "pos", "attn"):  # a checkpoint has each; older ones no block
            table[kind]
        kinds = [k for k in KINDS if k in table]
        for key in [*kinds, *(k for k in table if k not in kinds)]:
            row = table[key]
            components[key] = SavedComponent(
                kind=str(row.get("kind", key)),
                name=str(row["name"]),
                plugin=str(row["plugin"]),
                module=str(row["module"]),
                dist=None if row["dist"] is None else str(row["dist"]),
                version=None if row["version"] is None else str(row["version"]),
            )
            if components[key].kind not in (
                *KINDS, *ADAPTER_KINDS, *WEIGHT_KINDS, *PARAMETRIZATION_KINDS
            ):
                raise KeyError(f"kind {components[key].kind!r}")
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise bad(KEYS["components"], f"cannot be read ({type(e).__name__}: {e})") from None
    try:
        tied = load_json(meta.get(KEYS["tied"], "{}"))
    except json.JSONDecodeError as e:
        raise bad(KEYS["tied"], f"cannot be read ({e})") from None
    if not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise bad(KEYS["tied"], "cannot be read (not a mapping of names)")
    missing_stored = sorted(v for v in tied.values() if v not in header.tensors)
    if missing_stored:
        raise bad(
            KEYS["tied"], f"names tensors the file does not hold: {', '.join(missing_stored)}"
        )
    for key, value in [
        (KEYS["lmcore_version"], meta.get(KEYS["lmcore_version"], "?")),
        (KEYS["torch_version"], meta.get(KEYS["torch_version"], "?")),
        *(
            (f"{KEYS['components']} ({c.kind})", v)
            for c in components.values()
            for v in (c.name, c.plugin, c.module, c.dist or "", c.version or "")
        ),
    ]:
        if len(value) > _MAX_NAME or not value.isprintable():
            # lmcore writes names and versions; control characters (terminal escapes) or
            # megabytes in their place would reach every terminal that shows them
            raise bad(key, f"is not a short printable string ({clip(value)})")
    base = None
    if KEYS["base"] in meta:
        try:
            base = load_json(meta[KEYS["base"]])
            if not isinstance(base, dict) or not all(
                isinstance(base.get(k), str) for k in ("path", "spec", "checksum")
            ):
                raise TypeError("not {path, spec, checksum} strings")
        except (json.JSONDecodeError, TypeError) as e:
            raise bad(KEYS["base"], f"cannot be read ({e})") from None
    dtype = meta.get(KEYS["dtype"], "")
    _dtype(dtype, p)
    verify_metadata(p, meta)
    return CheckpointInfo(
        path=p,
        format_version=version,
        spec=meta[KEYS["spec"]],
        components=components,
        lmcore_version=meta.get(KEYS["lmcore_version"], "?"),
        torch_version=meta.get(KEYS["torch_version"], "?"),
        dtype=dtype,
        tied=tied,
        metadata={k: v for k, v in meta.items() if not k.startswith(PREFIX) and k != "format"},
        tensors=header.tensors,
        size=header.size,
        checksums=header.checksums,
        data_start=header.data_start,
        tokenizer=SavedTokenizer.from_metadata(meta, p),
        base=base,
    )


def _dtype(name: str, path: Path) -> torch.dtype:
    value = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise CheckpointError(
            f"{path}: has damaged lmcore metadata: {KEYS['dtype']} is {name!r}, not a torch "
            "dtype; the file was edited or damaged after lmcore saved it"
        )
    return value


# ------------------------------------------------------------------------------ resolving


def resolve_checkpoint(
    source: str | os.PathLike[str] | CheckpointInfo, registry: Registry | None = None
) -> Blueprint:
    """Resolve a checkpoint's embedded spec, checking each component's provider against the one
    that saved it.

    A component no installed plugin provides raises `CheckpointError` naming the distribution and
    version to install. A provider at another version (or from another distribution) warns with
    `CheckpointWarning`, or raises under `LMCORE_STRICT_PLUGINS` / `Registry(strict=True)`.
    """
    info = source if isinstance(source, CheckpointInfo) else read_info(source)
    registry = registry or get_registry()
    chosen: dict[str, Entry] = {}
    changed: dict[tuple[str, str], list[str]] = {}  # (saved with, installed now): components
    pins: set[str] = set()  # what to install to get the saved providers back
    for key, saved in info.components.items():
        chosen[key] = entry = _provider(info, saved, registry)
        kind = saved.kind
        now = entry.provenance
        if normalize_dist(now.qualifier) != normalize_dist(saved.dist or saved.plugin):
            pair = (str(saved), str(now))
        elif now.version != saved.version:
            pair = (f"{saved.dist} {saved.version}", f"{now.dist} {now.version}")
        else:
            continue
        changed.setdefault(pair, []).append(f"{kind} {saved.name!r}")
        if saved.requirement is not None:
            pins.add(saved.requirement)
    if changed:
        what = "; ".join(
            f"{_and(names)} {'was' if len(names) == 1 else 'were'} saved with {then}, and "
            f"{now} is installed"
            for (then, now), names in changed.items()
        )
        fix = f"pip install {' '.join(sorted(pins))}" if pins else "register what saved it"
        if registry.strict:
            raise CheckpointError(
                f"{info.path}: {what}. LMCORE_STRICT_PLUGINS is set, so this is an error: install "
                f"what saved it ({fix}) or unset LMCORE_STRICT_PLUGINS to load it anyway"
            )
        warnings.warn(
            f"{info.path}: {what}. Loading it anyway; if its tensors no longer fit, or to "
            f"reproduce it exactly, {fix}",
            CheckpointWarning,
            stacklevel=_outside_lmcore(),
        )
    try:
        return resolve(_qualified(info.spec, chosen, registry), registry)
    except SpecError as e:
        raise CheckpointError(
            f"{info.path}: its spec no longer resolves with the installed plugins: {e}"
        ) from None


def _outside_lmcore() -> int:
    """The `stacklevel` for a warning issued by this function's caller that names the first line
    outside lmcore on the way there: the user's call of `lmcore.load`, `train`, ..., however
    many of lmcore's functions lie between."""
    root = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(root):
        level, frame = level + 1, frame.f_back
    return level


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _provider(info: CheckpointInfo, saved: SavedComponent, registry: Registry) -> Entry:
    """The installed entry for a saved component: from the distribution that saved it when that
    one is installed, else the only provider of its name."""
    kind, name = saved.kind, saved.name
    matches = [e for e in registry.entries(kind) if e.name == name]
    if not matches:
        try:
            registry.get(kind, name)
            reason = ""
        except RegistryError as e:
            reason = f" (the registry says: {e})"
        if saved.requirement is not None:
            fix = f"install it: pip install {saved.requirement}"
        else:
            fix = (
                f"register it before loading (Registry.register / Registry.add, plugin "
                f"{saved.plugin!r} from module {saved.module})"
            )
        raise CheckpointError(
            f"{info.path}: needs {kind} {name!r}, provided by {saved} when it was saved, and no "
            f"installed plugin provides it{reason}; {fix}"
        )
    want = normalize_dist(saved.dist or saved.plugin)
    same = [e for e in matches if normalize_dist(e.provenance.qualifier) == want]
    if len(same) == 1:
        return same[0]
    if len(same) == 0 and len(matches) == 1:
        return matches[0]
    providers = "; ".join(str(e.provenance) for e in matches)
    raise CheckpointError(
        f"{info.path}: needs {kind} {name!r}, provided by {saved} when it was saved; it is now "
        f"provided by {len(matches)} plugins ({providers}) and the checkpoint cannot tell which "
        "to use: disable all but one with LMCORE_DISABLE_PLUGINS"
    )


def _qualified(spec: str, chosen: Mapping[str, Entry], registry: Registry) -> str:
    """The spec with each ambiguous component qualified by the provider chosen for it."""
    items = parse_items(spec)
    out = []
    for item in items:
        text = spec[item.start : item.value.end]
        kind = item.key or ""
        if (
            kind in SLOTS
            and kind in chosen  # a checkpoint older than the block kind has none
            and item.layers is None
            and registry.is_ambiguous(kind, chosen[kind].name)
        ):
            value = spec[item.value.start : item.value.end]
            if item.value.provider is not None:
                value = value.split(":", 1)[1]
            text = f"{kind}={chosen[kind].provenance.qualifier}:{value}"
        out.append(text)
    return ",".join(out)


# ------------------------------------------------------------------------------ save and load


def save(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, str] | None = None,
    tokenizer: SavedTokenizer | None = None,
) -> Path:
    """Write `model` (a `TransformerLM`, or one inside `torch.compile` or DDP wrappers) and
    everything needed to rebuild it to one safetensors file, atomically: `TransformerLM.save`.

    `metadata` adds the caller's own string entries (e.g. a trainer's step); names starting with
    "lmcore." and "format" are lmcore's. `tokenizer` (default: the model's own, `model.tokenizer`,
    which `lmcore.load` sets) is stored with the weights. Shared parameters (tied embeddings) are
    stored once. Returns the path written.
    """
    return unwrap(model).save(path, metadata=metadata, tokenizer=tokenizer)


def build_from_checkpoint(
    info: CheckpointInfo,
    blueprint: Blueprint,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    max_bytes: int | None = None,
    *,
    verify: bool = True,
    nonfinite: str = "warn",
) -> TransformerLM:
    """`lmcore.load`'s second half, for a caller that has resolved the checkpoint already
    (`resolve_checkpoint`): build `blueprint` and load the checkpoint's weights into it.
    `max_bytes`: as `build_model`'s size check; `verify`, `nonfinite`: as `lmcore.load`'s.

    The parameters are not initialised (`lmcore.model.empty`): the model is built with them on
    the meta device and the checkpoint's tensors, memory-mapped, become them (no copy when
    device and dtype are the file's), so loading costs about one read of the file."""
    if info.base is not None:
        return _onto_base(info, blueprint, device, dtype, max_bytes, verify, nonfinite)
    if verify:
        verify_checksums(info)  # before anything is allocated
    model = build_empty(blueprint, device, dtype or info.torch_dtype, max_bytes)
    load_weights(model, info, verify=False, convert=dtype is not None, nonfinite=nonfinite)
    model.tokenizer = info.tokenizer
    return model


def base_identity(path: str | os.PathLike[str]) -> dict[str, str]:
    """What an adapter file records of the base checkpoint it applies to: its path (absolute),
    its spec and `base_checksum`."""
    info = read_info(path)
    return {"path": str(info.path.resolve()), "spec": info.spec, "checksum": base_checksum(info)}


def base_checksum(info: CheckpointInfo) -> str:
    """The CRC-32 of a checkpoint's per-tensor checksums (`lmcore.checksums`), as 8 hex
    digits: it changes when any tensor does. A file saved without checksums has none to
    give: `CheckpointError` (save it again with lmcore)."""
    if info.checksums is None:
        raise CheckpointError(
            f"{info.path}: saved without checksums, so an adapter cannot record which base it "
            "is; load it and save it again (lmcore.load(...).save(...))"
        )
    return checksum(json.dumps(dict(info.checksums), sort_keys=True).encode("utf-8"))


def find_base(info: CheckpointInfo) -> Path:
    """The base checkpoint an adapter file names: its `relative` path (from the adapter's
    folder) when that exists, else its absolute `path`; `CheckpointError` naming both."""
    assert info.base is not None
    tried = []
    if "relative" in info.base:
        near = info.path.parent / info.base["relative"]
        if near.exists():
            return near
        tried.append(str(near))
    far = Path(info.base["path"])
    if far.exists():
        return far
    tried.append(str(far))
    raise CheckpointError(
        f"{info.path}: holds an adapter of the base checkpoint {info.base['path']}, which is not "
        f"there (tried {', '.join(tried)}); put the base back, or merge the adapter where both are"
    )


def _onto_base(
    info: CheckpointInfo,
    blueprint: Blueprint,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    max_bytes: int | None,
    verify: bool,
    nonfinite: str,
) -> TransformerLM:
    """An adapter file's model: its base checkpoint loaded (checked to be the one the adapter
    recorded, by checksum and spec) and the adapter's tensors applied."""
    assert info.base is not None
    base = checked_base(info, verify)
    model = build_empty(blueprint, device, dtype or base.torch_dtype, max_bytes)
    load_weights(model, info, verify=False, convert=dtype is not None, nonfinite=nonfinite)
    model.tokenizer = base.tokenizer
    model.adapter_base = dict(info.base)
    return model


def checked_base(info: CheckpointInfo, verify: bool = True) -> CheckpointInfo:
    """The base checkpoint of the adapter file `info`, checked to be the one the adapter
    recorded (by checksum and spec): `CheckpointError` naming both otherwise. `verify`: the
    checksums of both files first."""
    assert info.base is not None
    base = read_info(find_base(info))
    if verify:
        verify_checksums(base)
        verify_checksums(info)
    found = base_checksum(base)
    if found != info.base["checksum"]:
        raise CheckpointError(
            f"{info.path}: is an adapter of the base checkpoint with checksum "
            f"{info.base['checksum']} ({info.base['path']}), but {base.path} has checksum "
            f"{found}: its weights changed since the adapter was trained; use the base it was "
            "trained on"
        )
    if base.spec != info.base["spec"]:
        raise CheckpointError(
            f"{info.path}: its base was {info.base['spec']}, but {base.path} holds {base.spec}"
        )
    return base


def build_empty(
    blueprint: Blueprint | ModelSpec | str,
    device: torch.device | str | None,
    dtype: torch.dtype,
    max_bytes: int | None = None,
    registry: Registry | None = None,
    *,
    buffers: bool = True,
) -> TransformerLM:
    """The model, its parameters on the meta device for weights about to be assigned
    (`load_strict`), its buffers built on `device`; when a component leaves a buffer on meta
    (one derived from a parameter), the model is built the ordinary way.

    `buffers=False`, for a model that is only saved (a conversion): the whole model is built on
    meta, so what its state dict does not hold is never computed (RoPE's cos/sin tables,
    `context_length` rows each, are non-persistent), and `load_strict` puts the file's tensors
    on `device`. Such a model can be saved, not run."""
    if not buffers:
        model = TransformerLM(blueprint, device="meta", dtype=dtype, registry=registry)
        model.build_device = check_device(device)  # where `device_of` sends the tensors
        return model
    kw: dict[str, Any] = {"device": device, "dtype": dtype, "max_bytes": max_bytes}
    with parameters_on_meta():
        model = TransformerLM(blueprint, registry=registry, **kw)
    if any(b.is_meta for b in model.buffers()):
        model = TransformerLM(blueprint, registry=registry, **kw)
    return model


def load_weights(
    model: nn.Module,
    source: str | os.PathLike[str] | CheckpointInfo,
    *,
    verify: bool = True,
    convert: bool = False,
    nonfinite: str = "warn",
) -> None:
    """Copy an lmcore checkpoint's tensors into `model` (in place), strictly: any missing,
    unexpected or misshapen tensor raises `CheckpointError` listing them all, as does a tensor
    of another kind than the model's (`check_dtypes`; `convert` allows any) and a tie
    (`lmcore.tied`) that the stored tensors or the model contradict; an adapter file's base
    (`checked_base`) gives the tensors the adapter does not hold. `verify`: check the
    checksums first (`verify_checksums`). Values move to the model's device; a floating tensor
    is widened to the model's dtype. `nonfinite`: as `lmcore.load`'s."""
    info = source if isinstance(source, CheckpointInfo) else read_info(source)
    if verify:
        verify_checksums(info)
    lm = unwrap(model)
    expected = lm.state_dict()
    device = device_of(lm)
    # an adapter's weights alone: its (checked) base's tensors, then its own
    first = info if info.base is None else checked_base(info, verify=verify)
    tensors = read_tensors(first.path, device)
    _apply_ties(first, tensors, expected, shared_parameters(lm))
    if first is not info:
        tensors.update(read_tensors(info.path, device))
    if not convert:
        check_dtypes(tensors, expected, info.path)
    into = str(getattr(lm, "spec", info.spec))
    what = (
        f"its base {first.path} with the adapter of {info.spec}" if first is not info
        else f"the model its spec builds ({info.spec})" if into == info.spec
        else f"the model it is loaded into ({into}; the file's spec is {info.spec})"
    )  # fmt: skip
    load_strict(lm, tensors, info.path, what)
    check_finite(tensors, info.path, nonfinite)


def _apply_ties(
    info: CheckpointInfo,
    tensors: dict[str, Tensor],
    expected: Mapping[str, Tensor],
    aliases: Mapping[str, str],
) -> None:
    """Give each tied alias its stored tensor, when the tie is true: the model shares the two
    parameters (`aliases`, by identity), or the file stores the alias too with the same values
    (never replacing a stored tensor by another's)."""
    for alias, stored in info.tied.items():
        mine, theirs = expected.get(alias), expected.get(stored)
        shared = (
            mine is not None
            and theirs is not None
            and (aliases.get(alias) == stored or aliases.get(stored) == alias)
        )
        if alias in tensors:
            if not torch.equal(tensors[alias], tensors[stored]):
                raise CheckpointError(
                    f"{info.path}: its metadata ties {alias} to {stored} ({KEYS['tied']}), but "
                    f"the file stores a different {alias}; the metadata was edited after lmcore "
                    f"saved it: remove {alias!r} from {KEYS['tied']}, or restore the file"
                )
        elif not shared:
            raise CheckpointError(
                f"{info.path}: its metadata ties {alias} to {stored} ({KEYS['tied']}) and the "
                f"file does not store {alias}, but the model its spec builds keeps the two "
                f"apart ({info.spec}); the file was changed after lmcore saved it"
            )
        else:
            tensors[alias] = tensors[stored]


# ------------------------------------------------------------------------------ CS336 state dicts


def load_state_dict_file(
    path: str | os.PathLike[str],
    spec: Blueprint | ModelSpec | str,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
) -> TransformerLM:
    """Build `spec` and load a CS336-keyed state dict into it, strictly.

    `path` is a `torch.save` file (`.pt`, `.pth`, read with `torch.load(weights_only=True)`, which
    unpickles tensors and plain containers only) or a safetensors file. A CS336 training
    checkpoint `{"model": state_dict, "optimizer": ..., "iteration": ...}` gives its "model"
    entry, and the `_orig_mod.` prefix `torch.compile` adds to keys is removed. `dtype` defaults
    to the file's floating dtype. Mismatched tensors raise `CheckpointError` listing them.
    """
    p = Path(path)
    bp = resolve(spec, registry)
    if p.suffix == SUFFIX:
        read_header(p)
        state: Any = read_tensors(p, torch.device("cpu"))
    else:
        state = _torch_load(p)
    training = isinstance(state, dict) and isinstance(state.get("model"), dict)
    if training and not all(isinstance(v, Tensor) for v in state.values()):
        state = state["model"]  # a CS336 training checkpoint: {model, optimizer, iteration}
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise CheckpointError(
            f"{p}: holds a {type(state).__name__}, not a state dict (a mapping of names to "
            "tensors) nor a CS336 checkpoint with a 'model' state dict"
        )
    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    convert = dtype is not None
    if dtype is None:
        dtype = torch.float32
        floats = {k: v for k, v in state.items() if v.is_floating_point()}
        if floats:
            dtype = getattr(torch, dtype_of(floats))
    model = build_empty(bp, device, dtype)
    if not convert:
        check_dtypes(state, model.state_dict(), p)
    load_strict(model, state, p, f"the model of {bp.spec}")
    check_finite(state, p)
    return model


def _torch_load(p: Path) -> Any:
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{p}: is a directory, not a state-dict file") from None
    except pickle.UnpicklingError as e:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if found is None:
            detail = str(e).split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
            raise CheckpointError(
                f"{p}: is not a readable torch.save file (unpickling stops: "
                f"{detail[0] if detail else type(e).__name__}); lmcore reads CS336 state dicts "
                "written by torch.save, or safetensors files"
            ) from None
        raise CheckpointError(
            f"{p}: holds objects other than tensors and plain containers ({found.group(1)}), "
            "which torch.load(weights_only=True) refuses to unpickle (unpickling can run code); "
            "re-save just the state dict: torch.save(model.state_dict(), path)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{p}: is not a readable torch.save file ({first}); lmcore reads CS336 state dicts "
            "written by torch.save, or safetensors files"
        ) from None
