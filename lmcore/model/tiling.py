"""The tiling of one `tiled_attention` call (`lmcore.model.attention`), from the shapes alone:
batch rows, blocks of queries and the keys each may see, and the score elements the kept-weights
mode saves for backward (what the kernels' `activations` declarations count, in closed form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Tiles aim at this many score elements (1 MiB in float32): small enough to stay in a core's
# L2 cache across the passes over a tile, large enough that the matmuls stay efficient.
TILE_ELEMENTS = 1 << 18
QUERY_BLOCK = 64  # queries per tile, unless more fit in TILE_ELEMENTS
STREAM_BLOCK = 512  # keys per block of the online softmax when no weights need keeping
# With documents, a query block is at most this many key blocks long: a block of queries sees
# the keys from its first query's document start on, so shorter blocks skip more of them.
DOCUMENT_BLOCKS = 1


@dataclass(frozen=True)
class Plan:
    """The tiling of one call, from the shapes alone: batch rows, query and key blocks."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    causal: bool
    key_block: int  # 0: all of a query block's keys at once, weights kept for backward
    window: int = 0  # a query sees its last `window` keys; 0: all of them
    documents: bool = False  # block-causal within documents: tiles across them are skipped

    @staticmethod
    def of(
        q5: Tensor, k: Tensor, causal: bool, key_block: int, window: int = 0,
        documents: bool = False,
    ) -> Plan:  # fmt: skip
        B, Hkv, Sq, G, D = q5.shape
        return Plan(B, Hkv * G, Hkv, Sq, k.shape[2], D, causal, key_block, window, documents)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def keep(self) -> bool:
        return self.key_block == 0

    @property
    def offset(self) -> int:
        return self.k_len - self.q_len  # causal queries are aligned to the end of the keys

    @property
    def query_block(self) -> int:
        """`QUERY_BLOCK` queries, or more (a power of two) while a tile of one batch row stays
        within `TILE_ELEMENTS`, e.g. against a narrow key block. Recomputing, within that many
        per torch thread: the query blocks then decide nothing that is kept for backward."""
        budget = TILE_ELEMENTS * (1 if self.keep else torch.get_num_threads())
        fit = budget // max(1, self.heads * (self.key_block or self.k_len))
        block = max(QUERY_BLOCK, 1 << max(0, fit.bit_length() - 1))
        if self.documents and not self.keep:  # recomputing: the block decides nothing kept
            block = min(block, max(QUERY_BLOCK, DOCUMENT_BLOCKS * self.key_block))
        return block

    @property
    def batch_block(self) -> int:
        """Batch rows per tile: as many as `TILE_ELEMENTS` per torch thread holds (each thread
        works on its share of a tile's heads in its own cache; fewer, larger operations keep
        the threads from waiting on each other). Only how batch rows are grouped depends on
        the thread count, not what is computed or kept."""
        cols = self.key_block or self.k_len
        per_row = self.heads * min(self.query_block, self.q_len) * cols
        budget = TILE_ELEMENTS * torch.get_num_threads()
        return max(1, min(self.batch, budget // max(1, per_row)))

    @property
    def whole(self) -> bool:
        """Whether the call is one tile (every batch row, query and key at once) within one
        thread's budget, and so on any number of threads. From the shapes alone, without the
        thread count: torch.compile traces it (a call returning an int would break its graph)."""
        cols = self.key_block or self.k_len
        return (
            self.k_len <= cols
            and self.q_len <= QUERY_BLOCK
            and self.batch * self.heads * self.q_len * cols <= TILE_ELEMENTS
        )

    def batch_blocks(self) -> list[tuple[int, int]]:
        n = self.batch_block
        return [(b0, min(b0 + n, self.batch)) for b0 in range(0, self.batch, n)]

    def query_blocks(self) -> list[tuple[int, int, int, int]]:
        """`(i0, i1, kbeg, kend)`: each block of queries and the keys it may see, from the first
        within its first query's window to the last its last query may see."""
        n, out = self.query_block, []
        for i0 in range(0, self.q_len, n):
            i1 = min(i0 + n, self.q_len)
            kend = min(self.k_len, i1 + self.offset) if self.causal else self.k_len
            kbeg = max(0, i0 + self.offset - self.window + 1) if self.window else 0
            out.append((i0, i1, min(kbeg, kend), kend))
        return out

    def key_blocks(self, kbeg: int, kend: int) -> list[tuple[int, int]]:
        step = self.key_block or max(1, kend - kbeg)
        return [(j0, min(j0 + step, kend)) for j0 in range(kbeg, kend, step)]

    def kept_shapes(self) -> list[tuple[int, int, int]]:
        """Shapes of the weights `key_block=0` keeps, one `(bb·Hkv, n·G, kend - kbeg)` per
        tile."""
        if not self.keep:
            return []
        return [
            ((b1 - b0) * self.kv_heads, (i1 - i0) * self.group, kend - kbeg)
            for b0, b1 in self.batch_blocks()
            for i0, i1, kbeg, kend in self.query_blocks()
        ]


def kept_elements(plan: Plan) -> int:
    """Score elements the kept-weights mode saves for backward (0 when it recomputes): the
    sum over `kept_shapes`, in closed form, so that a declaration for any batch or sequence
    (`describe`, the size check) costs no loop over the tiles."""
    if not plan.keep:
        return 0
    if not plan.causal:
        if plan.window:  # not a call the model makes: the tiles, counted one by one
            return sum(a * b * c for a, b, c in plan.kept_shapes())
        per_head = plan.q_len * plan.k_len
    else:  # full query blocks t = 0.. see keys up to (t + 1)·n + offset; a last partial one all
        n = plan.query_block
        full, rest = divmod(plan.q_len, n)
        if not plan.window:
            per_head = n * n * full * (full + 1) // 2 + n * plan.offset * full + rest * plan.k_len
        else:  # block t starts at key max(0, t·n + c): at 0 for the first m blocks
            c = plan.offset - plan.window + 1
            m = min(full, -c // n + 1) if c <= 0 else 0
            per_head = n * (n * m * (m + 1) // 2 + plan.offset * m)
            per_head += n * (full - m) * (n + plan.window - 1)
            per_head += rest * (plan.k_len - max(0, full * n + c))
    return plan.batch * plan.heads * per_head


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype of scores, softmax statistics and gradients: float32 or wider."""
    return torch.promote_types(dtype, torch.float32)
