"""Token data: `prepare` text into flat token-id files, `TokenData` to read and batch them.

    from lmcore.data import TokenData, prepare

    prepare(["corpus/"], "data/corpus")           # train.bin, val.bin, tokenizer.json, meta.json
    data = TokenData.open("data/corpus")
    x, y = data.sampler(batch_size=32, context_length=256).batch(0)

Names are imported on first use: `prepare` (and `lmcore data prepare`) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcore.data.meta import EOT, DataMeta, dtype_for
    from lmcore.data.prepare import PrepareResult, load_tokenizer, prepare, train_tokenizer
    from lmcore.data.tokens import BatchSampler, EvalBatches, TokenData, get_batch, step_seed

_WHERE = {
    "EOT": "meta",
    "DataMeta": "meta",
    "dtype_for": "meta",
    "PrepareResult": "prepare",
    "load_tokenizer": "prepare",
    "prepare": "prepare",
    "train_tokenizer": "prepare",
    "BatchSampler": "tokens",
    "EvalBatches": "tokens",
    "TokenData": "tokens",
    "get_batch": "tokens",
    "step_seed": "tokens",
}

__all__ = [
    "EOT",
    "BatchSampler",
    "DataMeta",
    "EvalBatches",
    "PrepareResult",
    "TokenData",
    "dtype_for",
    "get_batch",
    "load_tokenizer",
    "prepare",
    "step_seed",
    "train_tokenizer",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lmcore.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lmcore.data.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *_WHERE]
