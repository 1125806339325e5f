"""The UTF-8 bytes each token stands for: what turns a loss per token into bits per byte
(`lmcore.eval.bpb`), for `lmcore eval` and for the trainer's `--eval-bpb` alike.

    table = token_bytes(tokenizer)             # UTF-8 bytes each token id stands for
    per_token = bytes_per_token(batches, tokenizer)  # the mean over fixed evaluation batches

A byte-level BPE (what `lmcore data prepare` trains, GPT-2's) spells each byte as one
character of its 256-symbol alphabet, so a token's bytes are the length of its spelling and
the bytes of any run of tokens are exactly those of its text, even where a character is split
across tokens. Special tokens (`<|endoftext|>`) stand for no text: 0 bytes (their loss still
counts). For another kind of tokenizer each token's bytes are those of its text decoded alone
(`<0xNN>` byte-fallback tokens count 1), which can miscount a character split across tokens.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lmcore.data.tokens import EvalBatches

__all__ = ["bytes_per_token", "is_byte_level", "token_bytes"]

_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def is_byte_level(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` decodes with byte-level BPE (its token spellings are bytes)."""
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    return _has_type(decoder, "ByteLevel")


def _has_type(node: Any, kind: str) -> bool:
    if not isinstance(node, dict):
        return False
    if node.get("type") == kind:
        return True
    return any(_has_type(d, kind) for d in node.get("decoders") or ())


def token_bytes(tokenizer: Tokenizer, vocab_size: int | None = None) -> np.ndarray:
    """The number of UTF-8 bytes each token id stands for, as an int64 array of `vocab_size`
    entries (default: the tokenizer's; ids it does not have count 0). See the module's
    docstring for the rule."""
    n = tokenizer.get_vocab_size() if vocab_size is None else vocab_size
    table = np.zeros(n, dtype=np.int64)
    special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    added = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
    byte_level = is_byte_level(tokenizer)
    for i in range(min(n, tokenizer.get_vocab_size())):
        if i in special:
            continue
        if i in added:  # an added token is matched as its text, not spelt in bytes
            table[i] = len(added[i].encode("utf-8"))
            continue
        spelling = tokenizer.id_to_token(i)
        if spelling is None:
            continue
        if byte_level:
            table[i] = len(spelling)
        elif _BYTE_FALLBACK.fullmatch(spelling):
            table[i] = 1
        else:
            table[i] = len(tokenizer.decode([i], skip_special_tokens=False).encode("utf-8"))
    return table


def bytes_per_token(batches: EvalBatches, tokenizer: Tokenizer) -> float:
    """The mean bytes per target token of fixed evaluation batches (this rank's rows of every
    batch): what turns their mean loss into bits per byte, `loss / (ln 2 · bytes_per_token)`."""
    table = token_bytes(tokenizer)
    T = batches.context_length
    total = count = 0
    for i in range(len(batches)):
        starts = batches.starts(i)
        targets = np.asarray(batches.tokens[starts[:, None] + np.arange(1, T + 1)], dtype=np.int64)
        total += int(table[np.minimum(targets, len(table) - 1)].sum())
        count += targets.size
    return total / max(count, 1)
