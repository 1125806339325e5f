"""Bits per byte: a loss that does not depend on the tokenizer, so models with different
vocabularies compare.

    table = token_bytes(tokenizer)             # UTF-8 bytes each token id stands for
    bpb = bits_per_byte(total_nats, table[targets].sum())

The definition: `bits per byte = total nats / (ln 2 · bytes)`, where the nats are summed over
every predicted token and the bytes are the UTF-8 bytes of the text those tokens stand for.
A byte-level BPE (what `lmcore data prepare` trains, GPT-2's) spells each byte as one
character of its 256-symbol alphabet, so a token's bytes are the length of its spelling and
the bytes of any run of tokens are exactly those of its text, even where a character is split
across tokens. Special tokens (`<|endoftext|>`) stand for no text: 0 bytes (their loss still
counts). For another kind of tokenizer each token's bytes are those of its text decoded alone
(`<0xNN>` byte-fallback tokens count 1), which can miscount a character split across tokens.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lmcore.data.tokens import EvalBatches

__all__ = ["bits_per_byte", "bytes_per_token", "is_byte_level", "token_bytes"]

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


def bits_per_byte(nats: float, num_bytes: float) -> float:
    """`nats / (ln 2 · num_bytes)`; NaN when there are no bytes."""
    if num_bytes <= 0:
        return math.nan
    return nats / (math.log(2) * num_bytes)


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
