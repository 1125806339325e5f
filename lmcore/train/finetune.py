"""Fine-tuning from a pretrained checkpoint: `lmcore train CKPT --data DIR --out RUN`.

    check_tokenizer(init, data)         # the data was tokenised by the checkpoint's tokenizer
    model = initial_model(bp, init, device=..., dtype=...)  # its spec, its weights

The model is the checkpoint's, its spec unchanged (`resolve_checkpoint`) and its weights loaded
(`load_weights`); the run records them as `init` in run.json. Its tokenizer is kept: the data
must have been prepared with it (`lmcore data prepare --chat FILE --tokenizer-from CKPT`, or
`--tokenizer` with the same tokenizer.json), which `check_tokenizer` compares by content, and
the run's tokenizer carries the checkpoint's chat template and special ids on into every
checkpoint it saves (`tokenizer_files`), so `lmcore chat RUN` talks in the same template.

`initial_model` is the one place a run's model is made: what changes a pretrained model before
its optimizer is built (an adapter, once it is a kind) applies to what it returns.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from lmcore.checkpoint import CheckpointInfo, load_weights
from lmcore.errors import TrainError
from lmcore.model.transformer import TransformerLM
from lmcore.runfiles import TOKENIZER_FILE

if TYPE_CHECKING:
    import torch

    from lmcore.blueprint import Blueprint
    from lmcore.data.tokens import TokenData

__all__ = ["check_tokenizer", "initial_model", "tokenizer_files"]


def initial_model(
    bp: Blueprint,
    init: CheckpointInfo | None,
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> TransformerLM:
    """The model a run starts from: `bp` built with fresh weights from torch's global generator
    (seeded by the caller), then `init`'s weights loaded when a checkpoint is given."""
    model = TransformerLM(bp, device=device, dtype=dtype)
    if init is not None:
        load_weights(model, init)
    return model


def _canonical(text: str) -> str:
    """A tokenizer.json's text as `tokenizers` writes it back: the same tokenizer spelled with
    other whitespace or key order compares equal."""
    from tokenizers import Tokenizer

    try:
        return str(Tokenizer.from_str(text).to_str())
    except Exception:  # tokenizers raises a bare Exception; compare the text as it is then
        return text


def _digest(text: str) -> str:
    return hashlib.sha256(_canonical(text).encode("utf-8")).hexdigest()[:12]


def check_tokenizer(init: CheckpointInfo, data: TokenData) -> None:
    """`TrainError` unless `data` was tokenised with `init`'s tokenizer: the one stored in the
    checkpoint, else the tokenizer.json its run keeps (`lmcore.runfiles.find_tokenizer`). A
    checkpoint with neither is checked by vocabulary alone (`TokenData.check`)."""
    from lmcore.runfiles import find_tokenizer

    if init.tokenizer is not None:
        theirs, where = init.tokenizer.json, f"the tokenizer stored in {init.path}"
    else:
        found = find_tokenizer(init.path, init.metadata).path
        if found is None:
            return
        theirs, where = found.read_text(encoding="utf-8"), str(found)
    file = data.path / data.meta.tokenizer_file
    ours = file.read_text(encoding="utf-8")
    if _canonical(ours) != _canonical(theirs):
        raise TrainError(
            f"--data {data.path} was tokenised with {file} (sha256 {_digest(ours)}…), not with "
            f"{where} (sha256 {_digest(theirs)}…): the model would read other ids than it "
            f"learnt; prepare the data with the checkpoint's tokenizer (lmcore data prepare "
            f"--chat FILE.jsonl --tokenizer-from {init.path} --out DIR)"
        )


def tokenizer_files(init: CheckpointInfo | None) -> dict[str, str]:
    """Files beside the run's tokenizer.json that carry the checkpoint's chat template and
    special ids into the run's checkpoints (`SavedTokenizer.hf_files`, less tokenizer.json,
    which the data's copy already is); none without a stored tokenizer."""
    if init is None or init.tokenizer is None:
        return {}
    return {k: v for k, v in init.tokenizer.hf_files().items() if k != TOKENIZER_FILE}
