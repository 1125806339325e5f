"""A training checkpoint: the model (lmcore.save's format) plus what resuming needs, without pickle.

    ckpt = save_checkpoint(run, step=200, model=model, optimizer=opt, state={...}, ...)
    state = load_checkpoint(ckpt, model, opt)   # weights, AdamW state and RNG states restored

One checkpoint is one directory (`lmcore.train.runs` names the files):

- `model.safetensors`: `lmcore.save(model)`, the spec and provenance, plus `train.step`,
  `train.tokens`, `train.tag` and `train.tokenizer` (the tokenizer's path relative to the
  file) and the tokenizer itself (`lmcore.tokenizer`) in its metadata. `lmcore.load`,
  `lmcore describe` and every command taking a checkpoint read it as it is.
- `trainer.safetensors`: the optimizer's tensors (`optimizer.{index}.{name}`: AdamW's
  `exp_avg`, `exp_avg_sq` and `step` per parameter) and the RNG states (`rng.torch`,
  `rng.cuda.{device}`, `rng.numpy`), with their CRC-32s (`lmcore.checksums`, as the model
  file's), verified when the checkpoint is resumed.
- `trainer.json`: the step, tokens and times, the data position (the sampler's batch `step` is
  a pure function of its seed and step, so the position is the step), the optimizer's
  parameter groups with each group's parameter names (checked on load), and the Python and
  numpy RNG fields that are not tensors.
- `tokenizer.json`: a copy of the run's tokenizer.

The directory is written hidden and renamed into place (`lmcore.train.runs.new_checkpoint_dir`).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from lmcore.atomic import atomic_path, atomic_write
from lmcore.checkpoint import load_weights, read_info, save
from lmcore.errors import CheckpointError, TrainError
from lmcore.jsonfile import read_versioned
from lmcore.model.reading import read_header, verify_checksums
from lmcore.model.saving import KEYS, checksums_json, save_tensors
from lmcore.tokenizer import SavedTokenizer
from lmcore.train.runs import (
    CHECKPOINTS,
    META_STEP,
    META_TAG,
    META_TOKENIZER,
    META_TOKENS,
    MODEL_FILE,
    STATE_JSON,
    STATE_TENSORS,
    TOKENIZER_FILE,
    Checkpoint,
    new_checkpoint_dir,
    prune,
    step_dir,
)

STATE_FORMAT: Final = "lmcore-trainer-state"
STATE_VERSION: Final = 1


def save_checkpoint(
    run: Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Mapping[str, Any],
    param_names: Sequence[Sequence[str]],
    state: Mapping[str, Any],
    tag: str,
    tokens: int,
    keep: int = 0,
) -> Checkpoint:
    """Write checkpoint `step` of `run` (model, optimizer, RNG states, `state`), whole or not at
    all, then keep the newest `keep` checkpoints (0: all). `param_names` are the parameter
    names of each optimizer group, in order; `state` is the loop's JSON-able bookkeeping."""
    # or the optimizer's state_dict() itself, gathered from FSDP shards
    opt_state = optimizer if isinstance(optimizer, Mapping) else optimizer.state_dict()
    opt_tensors, opt_json = flatten_optimizer(opt_state, param_names)
    rng_tensors, rng_json = rng_state()
    try:
        _write(run, step, model, opt_tensors, opt_json, rng_tensors, rng_json, state, tag, tokens)
    except OSError as e:  # a full disk: the checkpoints before this one are whole
        raise TrainError(
            f"cannot save checkpoint {run / 'checkpoints' / step_dir(step)}: "
            f"{e.strerror or e}; the checkpoints before it are whole: free space (or move the "
            f"run), then continue with lmcore train --resume {run}"
        ) from None
    prune(run, keep)
    return Checkpoint(run / CHECKPOINTS / step_dir(step), step)


def _write(
    run: Path,
    step: int,
    model: nn.Module,
    opt_tensors: Mapping[str, Tensor],
    opt_json: Mapping[str, Any],
    rng_tensors: Mapping[str, Tensor],
    rng_json: Mapping[str, Any],
    state: Mapping[str, Any],
    tag: str,
    tokens: int,
) -> None:
    # The model file carries its tokenizer too, so it stands alone (`lmcore.tokenizer`).
    own = run / TOKENIZER_FILE
    tokenizer = SavedTokenizer.from_file(own) if own.is_file() else None
    with new_checkpoint_dir(run, step) as tmp:
        save(
            model,
            tmp / MODEL_FILE,
            metadata={
                META_STEP: str(step),
                META_TOKENS: str(tokens),
                META_TAG: tag,
                META_TOKENIZER: TOKENIZER_FILE,
            },
            tokenizer=tokenizer,
        )
        state_tensors = {**opt_tensors, **rng_tensors}
        with atomic_path(tmp / STATE_TENSORS) as p:
            sums = {KEYS["checksums"]: checksums_json(state_tensors)}
            save_tensors(state_tensors, p, sums, run / CHECKPOINTS / step_dir(step) / p.name)
        with atomic_path(tmp / TOKENIZER_FILE) as p:
            shutil.copyfile(run / TOKENIZER_FILE, p)
        with atomic_write(tmp / STATE_JSON, "w") as f:
            body = {
                "format": STATE_FORMAT,
                "version": STATE_VERSION,
                "step": step,
                **state,
                "optimizer": opt_json,
                "rng": rng_json,
            }
            f.write(json.dumps(body, indent=1) + "\n")


def load_checkpoint(
    ckpt: Checkpoint,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    param_names: Sequence[Sequence[str]],
) -> dict[str, Any]:
    """Restore `model`'s weights, `optimizer`'s state and the RNG states from `ckpt`; return
    its `trainer.json`. `CheckpointError` when the files do not fit the model or optimizer."""
    info = read_info(ckpt.model)
    load_weights(model, info)
    file = ckpt.path / STATE_JSON
    state = read_versioned(
        file,
        format=STATE_FORMAT,
        version=STATE_VERSION,
        what="an lmcore trainer state",
        error=CheckpointError,
    )
    verify_checksums(read_header(ckpt.path / STATE_TENSORS))
    try:
        tensors = load_file(str(ckpt.path / STATE_TENSORS), device="cpu")
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{ckpt.path / STATE_TENSORS}: cannot be read ({e})") from None
    optimizer.load_state_dict(unflatten_optimizer(tensors, state["optimizer"], param_names, file))
    set_rng_state(tensors, state["rng"])
    return state


# ------------------------------------------------------------------------------ the optimizer


def flatten_optimizer(
    sd: Mapping[str, Any], param_names: Sequence[Sequence[str]]
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """An optimizer `state_dict()` as safetensors tensors and JSON: per-parameter tensors under
    `optimizer.{index}.{name}`, every other value (parameter groups, non-tensor state) JSON."""
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entries in sd["state"].items():
        for name, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    groups = []
    for group in sd["param_groups"]:
        row = {}
        for key, value in group.items():
            if isinstance(value, Tensor):
                value = value.item()
            elif isinstance(value, tuple):
                value = list(value)
            row[key] = value
        groups.append(row)
    names = [list(n) for n in param_names]
    return tensors, {"param_groups": groups, "param_names": names, "state": scalars}


def unflatten_optimizer(
    tensors: Mapping[str, Tensor],
    saved: Mapping[str, Any],
    param_names: Sequence[Sequence[str]],
    where: Path,
) -> dict[str, Any]:
    """The `state_dict()` that `flatten_optimizer` took apart, after checking that its
    parameter groups hold the same parameters as the optimizer it is for."""
    names = [list(n) for n in param_names]
    if saved["param_names"] != names:
        raise CheckpointError(
            f"{where}: the optimizer state is for other parameters than this model's "
            f"(saved groups of {[len(g) for g in saved['param_names']]} parameters, the model "
            f"has {[len(g) for g in names]}); the checkpoint belongs to another model"
        )
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for index, entries in saved["state"].items():
        state.setdefault(int(index), {}).update(entries)
    groups = [dict(g) for g in saved["param_groups"]]
    for g in groups:
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups}


# ------------------------------------------------------------------------------ RNG states


def rng_state() -> tuple[dict[str, Tensor], dict[str, Any]]:
    """torch (CPU and every CUDA device), numpy and Python RNG states: tensors and JSON."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    tensors["rng.numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    version, internal, gauss_next = random.getstate()
    return tensors, {
        "numpy": {"kind": kind, "pos": pos, "has_gauss": has_gauss, "cached_gaussian": cached},
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
    }


def set_rng_state(tensors: Mapping[str, Tensor], saved: Mapping[str, Any]) -> None:
    """Restore what `rng_state` saved (CUDA states only when as many devices are visible)."""
    torch.set_rng_state(tensors["rng.torch"])
    cuda = sorted(
        (int(k.rsplit(".", 1)[1]), v) for k, v in tensors.items() if k.startswith("rng.cuda.")
    )
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([v for _, v in cuda])
    n = saved["numpy"]
    keys = tensors["rng.numpy"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = saved["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
