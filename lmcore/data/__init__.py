"""Token data: `prepare` text into flat token-id files, `TokenData` to read and batch them.

    from lmcore.data import TokenData, prepare

    prepare(["corpus/"], "data/corpus")           # train.bin, val.bin, tokenizer.json, meta.json
    data = TokenData.open("data/corpus")
    x, y = data.sampler(batch_size=32, context_length=256).batch(0)

Names are imported on first use: `prepare` (and `lmcore data prepare`) never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcore.lazy import attach

if TYPE_CHECKING:
    from lmcore.data.meta import EOT as EOT
    from lmcore.data.meta import DataMeta as DataMeta
    from lmcore.data.meta import dtype_for as dtype_for
    from lmcore.data.preparing import PrepareResult as PrepareResult
    from lmcore.data.preparing import load_tokenizer as load_tokenizer
    from lmcore.data.preparing import prepare as prepare
    from lmcore.data.preparing import train_tokenizer as train_tokenizer
    from lmcore.data.tokens import BatchSampler as BatchSampler
    from lmcore.data.tokens import EvalBatches as EvalBatches
    from lmcore.data.tokens import TokenData as TokenData
    from lmcore.data.tokens import get_batch as get_batch
    from lmcore.data.tokens import step_seed as step_seed

__getattr__, __dir__ = attach(__name__)
