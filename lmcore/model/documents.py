"""Packed rows of documents: what a document-masked forward derives from the document ids.

`documents` is a `(B, T)` int64 tensor, non-decreasing along each row, equal ids one document
(`0 0 0 1 1 2 2 2`). From it: where each token's document starts (`document_starts`), each
token's position within its document (`document_positions`, what every positional encoding is
given), the dense block-causal `(B, 1, Sq, Sk)` mask of a kernel that takes no documents
itself (`same_document`), and, for the chunked recurrences (Mamba-2's SSD, the gated delta
rule), the factors that stop a state crossing a boundary (`ChunkResets`).

A recurrent state is reset at a document's first token exactly as if the decay before it were
`exp(-inf) = 0`: the state entering the token is forgotten, the token writes as the first one
of a sequence does. In the chunked forms every decay is a product `exp(γ_i - γ_j)` between two
tokens of a chunk, from the chunk's start to a token, or from a token to the chunk's end; each
is multiplied by 0 when a boundary lies between its two ends, and by 1 otherwise, so no
`-inf` ever enters a cumulative sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Int
from torch import Tensor


def document_starts(documents: Int[Tensor, "B T"]) -> Int[Tensor, "B T"]:
    """The index of the first token of each token's document, per row."""
    B, T = documents.shape
    index = torch.arange(T, device=documents.device).expand(B, T)
    first = torch.ones_like(documents, dtype=torch.bool)
    first[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return torch.where(first, index, 0).cummax(dim=1).values


def document_positions(documents: Int[Tensor, "B T"]) -> Int[Tensor, "B T"]:
    """Each token's position within its document: 0 at every document's first token."""
    T = documents.shape[1]
    return torch.arange(T, device=documents.device) - document_starts(documents)


def same_document(
    documents: Int[Tensor, "B Sk"], q_len: int | None = None
) -> Bool[Tensor, "B 1 Sq Sk"]:
    """True where query i and key j lie in one document: the mask, with causal attention,
    of block-causal attention. The `q_len` queries (default: every key) are the last ones,
    aligned to the end of the keys as causal attention aligns them."""
    sq = documents.shape[1] if q_len is None else q_len
    queries = documents[:, documents.shape[1] - sq :]
    return (queries[:, :, None] == documents[:, None, :])[:, None]


@dataclass(frozen=True)
class ChunkResets:
    """0/1 factors, `(B·H, N, ·)` in a dtype, that reset a chunked recurrence's state at each
    document's first token (module docstring), for N chunks of C tokens (the padding after the
    last token continues the last document).

    - `within (BH, N, C, C)`: 1 where tokens i and j of a chunk lie in one document;
    - `entering (BH, N, C)`: 1 where the state entering the chunk reaches token i;
    - `leaving (BH, N, C)`: 1 where token j's write reaches the chunk's end;
    - `through (BH, N)`: 1 where the entering state reaches the chunk's end.
    """

    within: Tensor
    entering: Tensor
    leaving: Tensor
    through: Tensor

    @staticmethod
    def of(
        documents: Int[Tensor, "B T"], heads: int, chunks: int, size: int, dtype: torch.dtype
    ) -> ChunkResets:
        B, T = documents.shape
        padded = documents
        if chunks * size > T:  # the padding continues the last document: it changes nothing
            padded = torch.cat([documents, documents[:, -1:].expand(B, chunks * size - T)], 1)
        d = padded.view(B, 1, chunks, size).expand(B, heads, chunks, size).reshape(-1, chunks, size)
        before = torch.cat([d[:, :1, 0], d[:, :-1, -1]], dim=1)  # the token before each chunk
        return ChunkResets(
            within=(d[..., :, None] == d[..., None, :]).to(dtype),
            entering=(d == before[..., None]).to(dtype),
            leaving=(d == d[..., -1:]).to(dtype),
            through=(before == d[..., -1]).to(dtype),
        )
