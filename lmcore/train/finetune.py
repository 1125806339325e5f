"""Fine-tuning from a pretrained checkpoint: `lmcore train CKPT --data DIR --out RUN`.

    check_tokenizer(init, data)         # the data was tokenised by the checkpoint's tokenizer
    model = initial_model(bp, init, device=..., dtype=...)  # its spec, its weights

The model is the checkpoint's, its spec unchanged (`resolve_checkpoint`) and its weights loaded
(`load_weights`); the run records them as `init` in run.json. Its tokenizer is kept: the data
must have been prepared with it (`lmcore data prepare --chat FILE --tokenizer-from CKPT`, or
`--tokenizer` with the same tokenizer.json), which `check_tokenizer` compares by content, and
the run's tokenizer carries the checkpoint's chat template and special ids on into every
checkpoint it saves (`tokenizer_files`), so `lmcore chat RUN` talks in the same template.

`initial_model` is the one place a run's model is made, and where an adapter meets a pretrained
model: `lmcore train CKPT --adapter "lora(rank=8)"` trains the checkpoint's spec with
``adapter=lora(rank=8)`` (`adapted_blueprint`), its base loaded and frozen, and each checkpoint of
the run holds the adapter's weights alone with the base's identity (path, spec, checksum:
`lmcore.adapting.attach_base`); run.json records the base (`init`, `base`) and the adapter.
A resumed run loads the base and the adapter from its newest checkpoint (`load_weights` reads
an adapter file's base too, refusing a base whose checksum changed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from lmcore.adapting import attach_base
from lmcore.blueprint import resolve
from lmcore.checkpoint import CheckpointInfo, load_weights
from lmcore.errors import PluginError, SpecError, TrainError
from lmcore.model.adapters import apply_adapter
from lmcore.model.transformer import TransformerLM
from lmcore.runfiles import TOKENIZER_FILE

if TYPE_CHECKING:
    import torch

    from lmcore.blueprint import Blueprint
    from lmcore.data.tokens import TokenData

__all__ = ["adapted_blueprint", "check_tokenizer", "initial_model", "plain", "tokenizer_files"]


def initial_model(
    bp: Blueprint,
    init: CheckpointInfo | None,
    *,
    device: torch.device,
    dtype: torch.dtype,
    base: Mapping[str, str] | None = None,
) -> TransformerLM:
    """The model a run starts from: `bp` built with fresh weights from torch's global generator
    (seeded by the caller), then `init`'s weights loaded when a checkpoint is given.

    A `bp` with an adapter over a plain `init` (`lmcore train CKPT --adapter ...`,
    `adapted_blueprint`): the checkpoint's model is built and loaded, then the adapter is
    applied to it (its base frozen, the adapter's weights drawn from the same generator) and
    the model remembers its base (`attach_base`), so its checkpoints hold the adapter alone.
    `base`: that identity for a model whose weights are loaded afterwards (a resumed run)."""
    if init is not None and bp.spec.adapter is not None and init.spec != str(bp.spec):
        model = TransformerLM(plain(bp), device=device, dtype=dtype)
        load_weights(model, init)
        apply_adapter(model, bp.parts["adapter"])
        model.blueprint, model.spec = bp, bp.spec
        attach_base(model, init.path)
        return model
    model = TransformerLM(bp, device=device, dtype=dtype)
    if init is not None:
        load_weights(model, init)
    if base is not None:
        model.adapter_base = dict(base)
    return model


def plain(bp: Blueprint) -> Blueprint:
    """`bp` without its adapter."""
    return resolve(replace(bp.spec, adapter=None), bp.registry)


def adapted_blueprint(bp: Blueprint, init: CheckpointInfo | None, adapter: str) -> Blueprint:
    """The checkpoint's blueprint `bp` with ``adapter=ADAPTER`` (`--adapter`): `TrainError`
    for a spec (which takes the key itself) and for a checkpoint that has an adapter already."""
    if init is None:
        raise TrainError(
            f"--adapter {adapter}: fine-tunes a checkpoint (lmcore train CKPT --adapter ...); "
            f"a spec takes the adapter as its key adapter= instead: lmcore train "
            f"'SPEC, adapter={adapter}'"
        )
    if bp.spec.adapter is not None:
        raise TrainError(
            f"--adapter {adapter}: {init.path} has an adapter already "
            f"(adapter={bp.spec.adapter}); merge it first (lmcore convert {init.path} --merge "
            "--out MERGED), then fine-tune the merged checkpoint"
        )
    try:
        return resolve(f"{bp.spec},adapter={adapter}", bp.registry)
    except (SpecError, PluginError) as e:
        raise TrainError(f"--adapter {adapter}: {e}") from None


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
