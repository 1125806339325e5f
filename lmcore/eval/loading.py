"""A model to evaluate and its tokenizer, found as `lmcore generate` finds them.

    model, info = load_model("runs/quickstart", device="cpu")
    tokenizer, where = load_tokenizer(info)            # beside it, in its run, in its data

`MODEL` is a model file, a checkpoint directory or a run directory (its newest checkpoint,
read again if a training run prunes it meanwhile: `lmcore.runfiles.with_checkpoint`); the
tokenizer is the one `lmcore.runfiles.find_tokenizer` finds for it, unless one is given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from lmcore.errors import EvalError
from lmcore.model.inputs import resolve_device
from lmcore.runfiles import find_tokenizer, with_checkpoint
from lmcore.sources import open_checkpoint, read_tokenizer

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

    from lmcore.checkpoint import CheckpointInfo
    from lmcore.model.transformer import TransformerLM
    from lmcore.registry import Registry

__all__ = ["load_model", "load_tokenizer"]


def load_model(
    path: str | os.PathLike[str],
    *,
    device: str = "auto",
    dtype: torch.dtype | None = None,
    registry: Registry | None = None,
) -> tuple[TransformerLM, CheckpointInfo]:
    """The model that `path` names, in eval mode on `device` (auto: cuda if available), in
    `dtype` (default: the checkpoint's own), and the checkpoint's info."""
    where = resolve_device(device)

    def read(file: Path) -> tuple[TransformerLM, CheckpointInfo]:
        source = open_checkpoint(file, find=False, registry=registry)
        assert source.info is not None  # a checkpoint's source has its info
        return source.model(where, dtype), source.info

    model, info = with_checkpoint(path, read)  # a training run may prune what it lists
    model.eval()
    return model, info


def load_tokenizer(
    info: CheckpointInfo, tokenizer: str | os.PathLike[str] | None = None
) -> tuple[Tokenizer, Path]:
    """The tokenizer for a checkpoint: `tokenizer` when given, else the checkpoint's own (saved
    with it), else the one found beside the model file, up to its run directory, or in the
    data directory its run names; and where it was. `EvalError` naming every place looked in
    when there is none."""
    if tokenizer is None and info.tokenizer is not None:
        return info.tokenizer.tokenizer(), info.path  # the checkpoint's own
    if tokenizer is not None:
        found = Path(tokenizer)
        if not found.is_file():
            raise EvalError(f"tokenizer {str(found)!r} does not exist; give a tokenizer.json")
    else:
        search = find_tokenizer(info.path, info.metadata)
        if search.found is None:
            raise EvalError(
                f"no tokenizer found for {str(info.path)!r} ({search.looked()}){search.unknown()}"
                "; pass --tokenizer PATH (e.g. the tokenizer.json lmcore data prepare wrote)"
            )
        found = search.found
    return read_tokenizer(found, EvalError), found


def check_vocab(tokenizer: Tokenizer, vocab_size: int, where: Path) -> None:
    """`EvalError` unless every id of `tokenizer` is one the model has."""
    if tokenizer.get_vocab_size() > vocab_size:
        raise EvalError(
            f"the tokenizer {str(where)!r} has {tokenizer.get_vocab_size():,} tokens but the "
            f"model's vocab_size is {vocab_size:,}; use the tokenizer the model was trained with"
        )
