"""Hugging Face model directories, both ways, reading and writing `config.json` and safetensors
itself; each family's tables are its module (`lmcore.hf.llama`, `lmcore.hf.mixtral`, ...).

    lmcore convert --from-hf DIR OUT.safetensors   # a model directory -> lmcore checkpoint
    lmcore convert --from-hf DIR --print-spec      # the spec its config.json gives
    lmcore convert --to-hf CKPT DIR                # an lmcore checkpoint -> a model directory

    model = lmcore.hf.load_hf("path/to/model")     # the same, in memory
    lmcore.hf.save_hf(model, "out/")               # loads with AutoModelForCausalLM.from_pretrained

`transformers` is never imported here; it is only the tests' reference.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn

from lmcore.atomic import atomic_path, atomic_write
from lmcore.checkpoint import (
    build_empty,
    build_from_checkpoint,
    read_info,
    resolve_checkpoint,
    save,
)
from lmcore.errors import ConversionError, clip
from lmcore.hf.family import Family, Reading, family_of, read_config, spec_to_config
from lmcore.hf.family import family as find_family
from lmcore.hf.rules import Field
from lmcore.hf.weights import from_hf_state_dict, to_hf_state_dict
from lmcore.locks import new_directory
from lmcore.model.reading import read_header, read_tensors
from lmcore.model.saving import dtype_of, save_tensors
from lmcore.model.transformer import TransformerLM, unwrap
from lmcore.model.weights import check_dtypes, check_finite, load_strict
from lmcore.registry import Registry
from lmcore.runfiles import HF_CONFIG, RUN_FILE, TOKENIZER_FILE
from lmcore.tokenizer import SavedTokenizer

__all__ = [
    "CONFIG_KEY",
    "INDEX",
    "WEIGHTS",
    "both_weights",
    "config_path",
    "convert_from_hf",
    "convert_to_hf",
    "hf_config",
    "hf_reading",
    "load_hf",
    "load_llama",
    "refuse_same",
    "save_hf",
    "save_llama",
    "source_files",
]

CONFIG_KEY: Final = "hf.config"  # checkpoint metadata: the source config.json
WEIGHTS: Final = "model.safetensors"
INDEX: Final = "model.safetensors.index.json"
# What a model directory's tokenizer is read from (`SavedTokenizer.from_file`).
_TOKENIZER_FILES: Final = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
)


# ------------------------------------------------------------------------------ directories


def config_path(path: str | os.PathLike[str]) -> Path | None:
    """The config.json a command-line argument names, if it names one: a directory holding a
    config.json (and no lmcore run), or a `.json` file. None otherwise (a spec, a checkpoint)."""
    p = Path(path)
    try:
        if p.is_dir() and (p / HF_CONFIG).is_file() and not (p / RUN_FILE).is_file():
            return p / HF_CONFIG
        if p.suffix == ".json" and p.is_file():
            return p
    except OSError:
        return None
    return None


def hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The config.json of a Hugging Face model directory, or the `.json` file `path` names."""
    p = Path(path)
    if p.is_dir():
        return _read_config(p)
    if p.suffix == ".json" and p.is_file():
        return _parse_config(p)
    raise ConversionError(f"{p}: is neither a Hugging Face model directory nor a config.json file")


def hf_reading(path: str | os.PathLike[str], *, ignore: Iterable[str] = ()) -> Reading:
    """What the config.json of a model directory (or the `.json` file `path`) says in lmcore's
    terms (`lmcore.hf.family.read_config`): the spec, its family, the kept fields, notes."""
    p = Path(path)
    where = p / HF_CONFIG if p.is_dir() else p
    return read_config(hf_config(p), str(where), ignore=ignore)


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / HF_CONFIG
    if not directory.is_dir():
        raise ConversionError(f"{directory}: is not a directory (a Hugging Face model directory)")
    if not path.is_file():
        raise ConversionError(
            f"{directory}: has no config.json; a Hugging Face model directory holds config.json "
            "and the weights (save one with model.save_pretrained(DIR))"
        )
    return _parse_config(path)


def _parse_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ConversionError(f"{path}: nests deeper than Python's parser follows") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: is not valid JSON ({e})") from None
    except ValueError as e:  # Python's int/str conversion limit (an integer of 4,300+ digits)
        raise ConversionError(f"{path}: holds a number lmcore cannot read ({e})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{path}: holds a JSON {type(config).__name__}, not an object")
    return config


def both_weights(directory: str | os.PathLike[str]) -> bool:
    """Whether a model directory holds both model.safetensors and a shard index. transformers
    then loads model.safetensors (`_get_resolved_checkpoint_files` in its modeling_utils tries
    SAFE_WEIGHTS_NAME before SAFE_WEIGHTS_INDEX_NAME), and so does lmcore."""
    d = Path(directory)
    return (d / WEIGHTS).is_file() and (d / INDEX).is_file()


def _weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding a model's weights: model.safetensors, else the shards of
    the index (transformers' order: `both_weights`), each inside `directory` (`_inside`)."""
    index = directory / INDEX
    if (directory / WEIGHTS).is_file():
        return [_inside(directory, WEIGHTS, directory / WEIGHTS)]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            shards = None
        except RecursionError:
            raise ConversionError(f"{index}: nests deeper than Python's parser follows") from None
        if shards is None or not all(isinstance(s, str) for s in shards):
            raise ConversionError(f"{index}: is not a valid safetensors index")
        files = [_inside(directory, s, index) for s in shards]
        missing = [s for s, f in zip(shards, files, strict=True) if not f.is_file()]
        if missing:
            raise ConversionError(
                f"{index}: names shards that are not in the directory: {', '.join(missing)}; "
                "copy the whole model directory"
            )
        return files
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


def source_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The files of a model directory that a conversion reads, and that no output may replace:
    config.json, the weights (model.safetensors, the index and its shards, whether they are
    there yet or not) and the tokenizer's files."""
    d = Path(directory)
    names = {HF_CONFIG, WEIGHTS, INDEX, *_TOKENIZER_FILES}
    try:
        shards = json.loads((d / INDEX).read_text(encoding="utf-8"))["weight_map"].values()
        names |= {s for s in shards if isinstance(s, str)}
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        pass  # no index, or one the conversion refuses by name
    return [d / name for name in sorted(names)]


def _layer_count(fam: Family, config: Mapping[str, Any], names: Iterable[str], where: Path) -> None:
    """The weights hold the layers config.json says (`num_hidden_layers`), checked on the
    tensor names before a model is built: a config edited to 10**12 layers is named here, not
    found out by building it."""
    field = next((r for r in fam.rules if isinstance(r, Field) and r.spec == "num_layers"), None)
    given = [n for n in (field.fields if field else ()) if type(config.get(n)) is int]
    if not given:
        return  # read_config named the problem already
    n = config[given[0]]
    starts = {
        w.theirs.partition("{i}")[0] for w in fam.tensors if "{i}" in w.theirs
    }  # "model.layers."
    starts |= {s.removeprefix(fam.prefix) for s in starts}  # a base model's file
    layers, first = set(), ""
    for name in names:
        for start in starts:
            index = name[len(start) :].partition(".")[0] if name.startswith(start) else ""
            if index.isascii() and index.isdigit() and len(index) <= 18:  # a name, not a size
                layers.add(int(index))
                first = first or start
    last = max(layers, default=None)
    if last is not None and last + 1 != n:  # a gap is named by the tensors found missing
        held = f"{last + 1:,} layer{'s' if last else ''}"
        raise ConversionError(
            f"{where}: {given[0]}={n:,}, but the weights hold {held} ({first}0 to "
            f"{first}{last}); config.json and the weights must come from the same model"
        )


def _read_weights(
    directory: Path, device: torch.device, check: Callable[[Iterable[str]], None]
) -> dict[str, Tensor]:
    files = _weight_files(directory)
    check([name for path in files for name in read_header(path).tensors])
    tensors: dict[str, Tensor] = {}
    for path in files:
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
    *,
    buffers: bool = True,
) -> tuple[TransformerLM, dict[str, Any]]:
    """`load_hf`, and the config.json it read. `buffers=False`: a model only to be saved, whose
    buffers outside the state dict are never built (`build_empty`)."""
    config = _read_config(directory)
    reading = read_config(config, str(directory / HF_CONFIG), ignore=ignore)
    where = torch.device(device) if device is not None else torch.device("cpu")
    fam, at = reading.family, directory / HF_CONFIG
    tensors = _read_weights(directory, where, lambda names: _layer_count(fam, config, names, at))
    saved = getattr(torch, dtype_of(tensors))
    # Parameters on meta (for a conversion, the buffers too): the file's tensors are assigned,
    # no initialisation is wasted.
    model = build_empty(reading.spec, device, dtype or saved, registry=registry, buffers=buffers)
    model.tokenizer = SavedTokenizer.from_directory(directory)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = from_hf_state_dict(reading.family, tensors, model.blueprint, shapes, str(directory))
    if dtype is None:
        check_dtypes(state, model.state_dict(), directory, ConversionError)
    load_strict(model, state, directory, f"the model of {model.spec}")
    check_finite(state, directory)
    return model, config


def load_hf(
    directory: str | os.PathLike[str],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    *,
    ignore: Iterable[str] = (),
) -> TransformerLM:
    """An lmcore model from a Hugging Face model directory of any family lmcore converts
    (config.json and safetensors weights, sharded or not), in the weights' dtype unless `dtype`
    is given. `ignore`: unknown config fields known not to matter (see `read_config`)."""
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
    """`lmcore convert --from-hf DIR OUT`: a model directory to an lmcore checkpoint, keeping the
    source config.json in its metadata ("hf.config") for the way back. `OUT` may not be one of
    the directory's own files (`source_files`), nor the directory: refused before anything is
    read or written. Only the weights are built: memory follows the files, not the context
    length config.json names (RoPE's tables are never computed)."""
    for kept in source_files(directory):
        refuse_same(kept, out, f"a file of the Hugging Face model directory {directory}")
    refuse_same(directory, out, "the Hugging Face model directory")
    model, config = _load(Path(directory), None, dtype, registry, ignore, buffers=False)
    return save(model, out, metadata={CONFIG_KEY: json.dumps(config, sort_keys=True)})


def refuse_same(source: str | os.PathLike[str], out: str | os.PathLike[str], what: str) -> None:
    """`ConversionError` naming both paths when writing `out` would replace `source`: the same
    path once resolved (symbolic links followed), or the same file by another name (a hard
    link, `os.path.samefile`)."""
    same = os.path.realpath(source) == os.path.realpath(out)
    if not same and os.path.exists(source) and os.path.exists(out):
        try:
            same = os.path.samefile(source, out)
        except OSError:
            same = False
    if same:
        how = "" if os.path.normpath(source) == os.path.normpath(out) else ", through a link"
        raise ConversionError(
            f"the output {out} is {source} ({what}{how}), which this conversion reads: writing "
            "it would replace the input; choose another output path"
        )


def _family(model_type: str | None) -> Family | None:
    return None if model_type is None else find_family(model_type)


def save_hf(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    model_type: str | None = None,
    base: Mapping[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Write `model` as a Hugging Face model directory (config.json and model.safetensors) that
    `transformers.AutoModelForCausalLM.from_pretrained` loads: as `model_type`'s family, else
    `base`'s (the config a conversion kept: fields that do not change the function are written
    back), else the first family that expresses the model. A directory that is not empty is
    refused unless `force`, which replaces it whole once the new one is written."""
    lm = unwrap(model)
    fam = _family(model_type)
    config = spec_to_config(lm.blueprint, lm.lm_head.weight.dtype, base, family=fam)
    _write(lm, config, Path(directory), force)
    return Path(directory)


def load_llama(
    directory: str | os.PathLike[str],
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
    *,
    ignore: Iterable[str] = (),
) -> TransformerLM:
    """`load_hf` of a Llama directory (any family reads; the name is kept for old callers)."""
    return load_hf(directory, device, dtype, registry, ignore=ignore)


def save_llama(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    base: Mapping[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """`save_hf` as a Llama (`LlamaForCausalLM`), whatever the base config's family."""
    return save_hf(model, directory, model_type="llama", base=base, force=force)


def convert_to_hf(
    checkpoint: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    *,
    model_type: str | None = None,
    registry: Registry | None = None,
    force: bool = False,
) -> Path:
    """`lmcore convert --to-hf CKPT DIR`: an lmcore checkpoint to a model directory (the family
    as `save_hf` picks it). The spec is checked before any weight is read."""
    refuse_same(checkpoint, directory, "the lmcore checkpoint")
    info = read_info(checkpoint)
    bp = resolve_checkpoint(info, registry)
    base = json.loads(info.metadata.get(CONFIG_KEY, "{}"))
    base = base if isinstance(base, dict) else None
    config = spec_to_config(bp, info.torch_dtype, base, family=_family(model_type))
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
    tensors = to_hf_state_dict(family_of(config), state, model.blueprint)
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
        with atomic_write(tmp / HF_CONFIG, "w") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if model.tokenizer is not None:  # the tokenizer travels with the weights, both ways
            for name, text in model.tokenizer.hf_files().items():
                with atomic_write(tmp / name, "w") as f:
                    f.write(text)
