"""Hugging Face model directories, both ways, reading and writing `config.json` and safetensors
itself; the family's tables are `lmcore.hf.llama`.

    lmcore convert --from-hf DIR OUT.safetensors   # a Llama model directory -> lmcore checkpoint
    lmcore convert --to-hf CKPT DIR                # an lmcore checkpoint -> a Llama directory

    model = lmcore.hf.load_llama("path/to/llama")  # the same, in memory
    lmcore.hf.save_llama(model, "out/")            # loads with LlamaForCausalLM.from_pretrained

`transformers` is never imported here; it is only the tests' reference.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn

from lmcore.atomic import atomic_path, atomic_write
from lmcore.checkpoint import (
    build_from_checkpoint,
    check_dtypes,
    check_finite,
    load_strict,
    read_info,
    resolve_checkpoint,
    save,
)
from lmcore.errors import ConversionError, clip
from lmcore.hf.llama import config_to_spec, from_hf_state_dict, spec_to_config, to_hf_state_dict
from lmcore.locks import new_directory
from lmcore.model.reading import read_header, read_tensors
from lmcore.model.saving import dtype_of, save_tensors
from lmcore.model.transformer import TransformerLM, unwrap
from lmcore.registry import Registry

__all__ = [
    "CONFIG_KEY",
    "INDEX",
    "WEIGHTS",
    "convert_from_hf",
    "convert_to_hf",
    "load_llama",
    "save_llama",
]

CONFIG_KEY: Final = "hf.config"  # checkpoint metadata: the source config.json
WEIGHTS: Final = "model.safetensors"
INDEX: Final = "model.safetensors.index.json"


# ------------------------------------------------------------------------------ directories


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not directory.is_dir():
        raise ConversionError(f"{directory}: is not a directory (a Hugging Face model directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ConversionError(f"{path}: nests deeper than Python's parser follows") from None
    except FileNotFoundError:
        raise ConversionError(
            f"{directory}: has no config.json; a Hugging Face model directory holds config.json "
            "and the weights (save one with model.save_pretrained(DIR))"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{path}: holds a JSON {type(config).__name__}, not an object")
    return config


def _weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding a model's weights: one file, or the shards of an index,
    each inside `directory` (`_inside`)."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
            if not all(isinstance(s, str) for s in shards):
                raise TypeError("a shard name is not a string")
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ConversionError(f"{index}: is not a valid safetensors index") from None
        except RecursionError:
            raise ConversionError(f"{index}: nests deeper than Python's parser follows") from None
        files = [_inside(directory, s, index) for s in shards]
        missing = [s for s, f in zip(shards, files, strict=True) if not f.is_file()]
        if missing:
            raise ConversionError(
                f"{index}: names shards that are not in the directory: {', '.join(missing)}; "
                "copy the whole model directory"
            )
        return files
    if (directory / WEIGHTS).is_file():
        return [_inside(directory, WEIGHTS, directory / WEIGHTS)]
    pickled = sorted(p.name for p in directory.glob("*.bin"))
    hint = (
        f" (found {', '.join(pickled)}: pickle files, which lmcore never loads; re-save the "
        "model with save_pretrained(DIR), which writes safetensors)"
        if pickled
        else ""
    )
    raise ConversionError(f"{directory}: has no {WEIGHTS} and no {INDEX}{hint}")


def _inside(directory: Path, name: str, where: Path) -> Path:
    """`directory / name`, which must lie inside `directory` once symbolic links are followed:
    a model directory's weights are its own, never a path its index points elsewhere
    (`/abs/other.safetensors`, `../x.safetensors`). The one exception is the layout of the
    Hugging Face hub cache, whose `snapshots/REV/` links each file to the repository's
    `blobs/`."""
    file = directory / name
    real, home = Path(os.path.realpath(file)), Path(os.path.realpath(directory))
    cache = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
    if home in real.parents or (
        cache is not None and real.parent == cache and Path(os.path.normpath(file)).parent == home
    ):
        return file
    raise ConversionError(
        f"{where}: names {clip(name, 200)}, which resolves to {clip(str(real), 200)}, outside "
        f"the model directory {directory}; a model directory holds its own weights: copy the "
        "shards into it"
    )


def _read_weights(directory: Path, device: torch.device) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    for path in _weight_files(directory):
        read_header(path)
        for name, t in read_tensors(path, device).items():
            if name in tensors:
                raise ConversionError(f"{path}: tensor {name!r} is also in another shard")
            tensors[name] = t
    return tensors


def _load(
    directory: Path,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    registry: Registry | None,
    ignore: Iterable[str],
) -> tuple[TransformerLM, dict[str, Any]]:
    config = _read_config(directory)
    spec = config_to_spec(config, str(directory / "config.json"), ignore=ignore)
    where = torch.device(device) if device is not None else torch.device("cpu")
    tensors = _read_weights(directory, where)
    saved = getattr(torch, dtype_of(tensors))
    model = TransformerLM(spec, device=device, dtype=dtype or saved, registry=registry)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = from_hf_state_dict(tensors, model.spec, str(directory), shapes)
    if dtype is None:
        check_dtypes(state, model.state_dict(), directory, ConversionError)
    load_strict(model, state, directory, f"the model of {model.spec}")
    check_finite(state, directory)
    return model, config


def load_llama(
    directory: str | os.PathLike[str],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    *,
    ignore: Iterable[str] = (),
) -> TransformerLM:
    """An lmcore model from a Hugging Face Llama model directory (config.json and safetensors
    weights, sharded or not), in the weights' dtype unless `dtype` is given. `ignore`: unknown
    config fields known not to matter (see `config_to_spec`)."""
    model, _ = _load(Path(directory), device, dtype, registry, ignore)
    return model


def convert_from_hf(
    directory: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    ignore: Iterable[str] = (),
) -> Path:
    """`lmcore convert --from-hf DIR OUT`: a Llama directory to an lmcore checkpoint, keeping the
    source config.json in its metadata ("hf.config") for the way back."""
    model, config = _load(Path(directory), None, dtype, registry, ignore)
    return save(model, out, metadata={CONFIG_KEY: json.dumps(config, sort_keys=True)})


def save_llama(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    base: Mapping[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Write `model` as a Hugging Face Llama directory (config.json and model.safetensors) that
    `transformers.LlamaForCausalLM.from_pretrained` loads. `base`: passive config fields to keep
    (see `spec_to_config`). A directory that is not empty is refused unless `force`, which
    replaces it whole once the new one is written (no old file stays beside the new ones)."""
    lm = unwrap(model)
    config = spec_to_config(lm.blueprint, lm.lm_head.weight.dtype, base)
    _write(lm, config, Path(directory), force)
    return Path(directory)


def convert_to_hf(
    checkpoint: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    *,
    registry: Registry | None = None,
    force: bool = False,
) -> Path:
    """`lmcore convert --to-hf CKPT DIR`: an lmcore checkpoint to a Llama directory. The spec is
    checked before any weight is read; `force` as `save_llama`'s."""
    info = read_info(checkpoint)
    bp = resolve_checkpoint(info, registry)
    base = json.loads(info.metadata.get(CONFIG_KEY, "{}"))
    config = spec_to_config(bp, info.torch_dtype, base if isinstance(base, dict) else None)
    out = Path(directory)
    _write(build_from_checkpoint(info, bp), config, out, force, keep=info.path)
    return out


def _write(
    model: TransformerLM,
    config: Mapping[str, Any],
    out: Path,
    force: bool,
    keep: Path | None = None,
) -> None:
    """Write the directory whole, beside `out`, and put it in `out`'s place (`new_directory`);
    `keep`: the checkpoint being converted, which must not be inside a directory replaced."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tensors = to_hf_state_dict(state, model.spec)
    with new_directory(
        out,
        force=force,
        what="target directory",
        error=ConversionError,
        fix="pass --force to replace it whole, or choose an empty directory",
        keep_out=[] if keep is None else [("the checkpoint", keep)],
    ) as tmp:
        with atomic_path(tmp / WEIGHTS) as path:
            save_tensors(tensors, path, {"format": "pt"}, out / WEIGHTS)
        with atomic_write(tmp / "config.json", "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
