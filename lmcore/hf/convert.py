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
from safetensors.torch import save_file
from torch import Tensor, nn

from lmcore.atomic import atomic_path, atomic_write
from lmcore.checkpoint import (
    build_from_checkpoint,
    load_strict,
    read_header,
    read_info,
    read_tensors,
    resolve_checkpoint,
    save,
)
from lmcore.errors import ConversionError
from lmcore.hf.llama import config_to_spec, from_hf_state_dict, spec_to_config, to_hf_state_dict
from lmcore.model.saving import dtype_of
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
    """The safetensors files holding a model's weights: one file, or the shards of an index."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ConversionError(f"{index}: is not a valid safetensors index") from None
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise ConversionError(
                f"{index}: names shards that are not in the directory: {', '.join(missing)}; "
                "copy the whole model directory"
            )
        return [directory / s for s in shards]
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    pickled = sorted(p.name for p in directory.glob("*.bin"))
    hint = (
        f" (found {', '.join(pickled)}: pickle files, which lmcore never loads; re-save the "
        "model with save_pretrained(DIR), which writes safetensors)"
        if pickled
        else ""
    )
    raise ConversionError(f"{directory}: has no {WEIGHTS} and no {INDEX}{hint}")


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
    state = from_hf_state_dict(tensors, model.spec, str(directory))
    load_strict(model, state, directory, f"the model of {model.spec}")
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
    model: nn.Module, directory: str | os.PathLike[str], *, base: Mapping[str, Any] | None = None
) -> Path:
    """Write `model` as a Hugging Face Llama directory (config.json and model.safetensors) that
    `transformers.LlamaForCausalLM.from_pretrained` loads. `base`: passive config fields to keep
    (see `spec_to_config`). Refuses a directory that already holds other weights."""
    lm = unwrap(model)
    config = spec_to_config(lm.blueprint, lm.lm_head.weight.dtype, base)
    _write(lm, config, Path(directory))
    return Path(directory)


def convert_to_hf(
    checkpoint: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    *,
    registry: Registry | None = None,
) -> Path:
    """`lmcore convert --to-hf CKPT DIR`: an lmcore checkpoint to a Llama directory. The spec is
    checked before any weight is read."""
    info = read_info(checkpoint)
    bp = resolve_checkpoint(info, registry)
    base = json.loads(info.metadata.get(CONFIG_KEY, "{}"))
    config = spec_to_config(bp, info.torch_dtype, base if isinstance(base, dict) else None)
    out = Path(directory)
    _write(build_from_checkpoint(info, bp), config, out)
    return out


def _write(model: TransformerLM, config: Mapping[str, Any], out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConversionError(f"{out}: exists and is not a directory")
    others = sorted(
        p.name
        for pattern in ("*.safetensors", "*.bin", "*.index.json", "*.pt", "*.pth")
        for p in (out.glob(pattern) if out.is_dir() else [])
        if p.name != WEIGHTS
    )
    if others:
        raise ConversionError(
            f"{out}: already holds other weights ({', '.join(others)}), which from_pretrained "
            "could pick instead; choose an empty directory"
        )
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    with atomic_path(out / WEIGHTS) as tmp:
        save_file(to_hf_state_dict(state, model.spec), tmp, metadata={"format": "pt"})
    with atomic_write(out / "config.json", "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
