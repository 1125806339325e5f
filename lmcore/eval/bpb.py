"""Bits per byte: a loss that does not depend on the tokenizer, so models with different
vocabularies compare.

    table = token_bytes(tokenizer)             # UTF-8 bytes each token id stands for
    bpb = bits_per_byte(total_nats, table[targets].sum())

The definition: `bits per byte = total nats / (ln 2 · bytes)`, where the nats are summed over
every predicted token and the bytes are the UTF-8 bytes of the text those tokens stand for.
How many bytes a token stands for is counted in `lmcore.data.bytecount` (its rule is there),
below both the trainer (`--eval-bpb`) and evaluation, which import it from there.
"""

from __future__ import annotations

import math

from lmcore.data.bytecount import bytes_per_token, is_byte_level, token_bytes

__all__ = ["bits_per_byte", "bytes_per_token", "is_byte_level", "token_bytes"]


def bits_per_byte(nats: float, num_bytes: float) -> float:
    """`nats / (ln 2 · num_bytes)`; NaN when there are no bytes."""
    if num_bytes <= 0:
        return math.nan
    return nats / (math.log(2) * num_bytes)
