"""Exact attention in tiles with a hand-written backward: plain torch, FlashAttention's maths.

`tiled_attention` computes `softmax(q kᵀ / sqrt(D) + bias) v` one tile of queries at a time, so
every pass over the scores touches a block small enough to stay in cache, and a causal tile never
computes the keys that lie wholly ahead of its queries. The forward and the backward are each one
operator (`torch.ops.lmcore.tiled_attention` and `..._backward`), so the backward writes each
tile's gradients straight into the gradient buffers (autograd through slices would add a full-size
zero tensor per tile), and torch.compile sees two opaque calls.

Two modes, the two built-in kernels:

- `key_block=None` (`attn=sdpa`): a tile holds a block of queries against all the keys they may
  see; its softmax numerator `exp(s - max)` is kept for backward, so memory grows with Sq·Sk
  (the causal triangle, not the square).
- `key_block=N` (`attn=chunked`): each query block walks its keys N at a time with the online
  softmax (running max and sum, Milakov & Gimelshein 2018); only the output and each row's
  log-sum-exp are kept, and backward recomputes every key block's weights (Dao et al., 2022).
  Memory grows linearly with the sequence.

Without a gradient nothing is kept and no operator is needed: `tiled_attention` calls the
tiling directly, and a call that is one tile (a decoding step's few queries against the KV cache)
runs as a handful of plain operators, which torch.compile can trace and fuse.

Grouped-query heads without repeating k and v: q is laid out `(B, Hkv, Sq, G, D)`, so one key
head's G query heads form one `(Sq·G, D)` matrix against its `(Sk, D)` keys. Causal queries are
aligned to the end of the keys (query i sits at position Sk - Sq + i). A query whose keys are
all masked returns zeros, as torch's fused kernel does. Scores, softmax statistics, the kept
weights and the backward run in float32 (or wider) whatever the input dtype.

Three options of the scores, each off by default (and then not computed at all, so the default
is what it always was): a query `scale` other than 1 / sqrt(D); soft-capping, `cap·tanh(s / cap)`
before the bias and mask (Gemma 2), whose derivative `1 - tanh²` the backward recomputes from
q and k; and a sliding `window`, a query at position p seeing only keys p - window + 1 .. p
(Mistral, Gemma 2): the keys wholly behind a query block's window are skipped like the keys
ahead of it, and the kept weights shrink to the window.

Attention sinks (gpt-oss): a learned logit per head, `sinks (H,)`, joins every row's softmax
as one more key with no value, `exp(s_j) / (Σ exp(s_i) + exp(sink))`. It starts each row's
running max and sum, so it is exact for any size of sink or scores; its gradient is
`-Σ_rows p_sink · rowsum(dO ∘ O)`, from the row's log-sum-exp (or, with kept weights, from the
sink's weight kept beside them).

FLOPs are counted as torch counts its fused attention (`torch.utils.flop_counter`): the whole
`Sq × Sk` score matrix, `4·B·H·Sq·Sk·D` forward, whether or not causal tiles skip a part.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula
from torch.utils._python_dispatch import _get_current_dispatch_mode

from lmcore.model.tiling import (  # noqa: F401  (the tiling constants: re-exported)
    QUERY_BLOCK,
    STREAM_BLOCK,
    TILE_ELEMENTS,
    Plan,
    accumulator,
    kept_elements,
)

T = TypeVar("T")
# Below torch's grain size (at::internal::GRAIN_SIZE) an elementwise op runs on the calling
# thread: a product of fewer multiplications runs as one (`_attend_whole`).
SERIAL_ELEMENTS = 32768

if TYPE_CHECKING:
    from functools import _lru_cache_wrapper


@lru_cache(maxsize=8)
def exp_floor(dtype: torch.dtype) -> float:
    """The least shifted score exp is given, `ceil(log(smallest normal))` of the dtype the
    weights are computed in: -87 in float32, -708 in float64. exp on a CPU runs tens of times
    slower where its result would be subnormal (and several times slower on -inf), so scores
    below it are raised to it. A weight at or above the smallest normal is computed exactly;
    one below it (its row's largest weight being 1) becomes exp(floor), less than twice the
    smallest normal, an absolute change far under the dtype's resolution at 1. Masked keys are
    set to exactly 0 afterwards."""
    return float(math.ceil(math.log(torch.finfo(dtype).tiny)))


@lru_cache(maxsize=64)
def _ahead(rows: int, cols: int, first: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`(rows, 1, cols)`: 1 where key `first + c` lies ahead of query row r (positions relative
    to the tile's first query), else 0; cached, as every layer and step asks for the same.
    Multiplied and added rather than masked in: broadcast arithmetic is several times faster
    than a broadcast masked_fill on a CPU."""
    r = torch.arange(rows, device=device)[:, None, None]
    c = torch.arange(cols, device=device)[None, None, :]
    return (c + first > r).to(dtype)


@lru_cache(maxsize=64)
def _ahead_inf(
    rows: int, cols: int, first: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """`_ahead` as -inf where ahead, else 0: added to the scores before the row max."""
    ahead = _cached(_ahead, rows, cols, first, dtype, device)
    return ahead.mul(-math.inf).nan_to_num_(nan=0.0, neginf=-math.inf)


@lru_cache(maxsize=64)
def _behind(rows: int, cols: int, first: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`1 - _ahead`: multiplied into the weights, it zeroes the keys ahead."""
    return 1 - _cached(_ahead, rows, cols, first, dtype, device)


@lru_cache(maxsize=64)
def _behind_inf(
    rows: int, cols: int, last: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """`(rows, 1, cols)`: -inf where key column c lies behind query row r's window
    (`c - r <= last`), else 0; added to the scores like `_ahead_inf`."""
    r = torch.arange(rows, device=device)[:, None, None]
    c = torch.arange(cols, device=device)[None, None, :]
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(c - r <= last, -math.inf, zero)


def _cached(fn: _lru_cache_wrapper[T], *args: Any) -> T:
    """`fn(*args)` from its lru_cache; under torch.compile the function itself, which the
    graph computes once (the compiler ignores the cache and warns about it)."""
    if torch.compiler.is_compiling():
        return fn.__wrapped__(*args)
    return fn(*args)


def _as_4d(t: Tensor | None) -> Tensor | None:
    """A mask or bias broadcastable to (B, H, Sq, Sk), with exactly four dimensions."""
    while t is not None and t.ndim < 4:
        t = t.unsqueeze(0)
    return t


def _tile(t: Tensor, b: tuple[int, int], i: tuple[int, int], j: tuple[int, int], kv: int) -> Tensor:
    """Batch rows b, queries i and keys j of a 4-d mask or bias (size-1 dimensions broadcast as
    they are), laid out `(bb, Hkv, n, G, kb)` like a tile's scores."""
    every = slice(None)
    t = t[
        slice(*b) if t.shape[0] > 1 else every,
        :,
        slice(*i) if t.shape[2] > 1 else every,
        slice(*j) if t.shape[3] > 1 else every,
    ]
    if t.shape[1] == 1:
        return t.unsqueeze(3)  # (bb, 1, n, 1, kb)
    return t.view(t.shape[0], kv, -1, *t.shape[2:]).transpose(2, 3)  # (bb, Hkv, n, G, kb)


def _diagonal(plan: Plan, i: tuple[int, int], j: tuple[int, int]) -> tuple[int, int] | None:
    """For a causal tile, `(column, first)`: the tile's columns from `column` on hold keys ahead
    of some of its queries, the first of them `first` positions after the tile's first query;
    None when every key of the tile lies behind every query."""
    if not plan.causal:
        return None
    first = max(j[0], i[0] + plan.offset + 1)
    if first >= j[1]:
        return None
    return first - j[0], first - i[0] - plan.offset


class _Spans:
    """Where the document of each query starts, for a document-masked call: on the device for
    the tiles' masks, and on the host for the tiling, which starts each query block's keys at
    its first query's document and masks only the tiles that hold keys before a later one's."""

    def __init__(self, documents: Tensor, plan: Plan):
        from lmcore.model.documents import document_starts

        self.starts = document_starts(documents)[:, plan.offset :]  # (B, Sq)
        self.host = self.starts.cpu()  # one synchronisation per call
        self.keys: dict[tuple[int, int], Tensor] = {}

    def first(self, b: tuple[int, int], i0: int) -> int:
        """The first key any query of the block (rows b, from query i0 on) may see."""
        return int(self.host[b[0] : b[1], i0].min())

    def needs_mask(self, b: tuple[int, int], i: tuple[int, int], j0: int) -> bool:
        """Whether a tile from key j0 on holds a key before some query's document start."""
        return j0 < int(self.host[b[0] : b[1], i[1] - 1].max())

    def mask(self, b: tuple[int, int], i: tuple[int, int], j: tuple[int, int]) -> Tensor:
        """`(bb, 1, n, 1, kb)`: True where key j lies in query i's document (at or after its
        start; the causal part is the tile's own)."""
        keys = self.keys.get(j)
        if keys is None:
            keys = self.keys[j] = torch.arange(*j, device=self.starts.device)
        seen = keys >= self.starts[b[0] : b[1], i[0] : i[1], None]  # (bb, n, kb)
        return seen[:, None, :, None, :]


def _scores(
    qt: Tensor,
    kt: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    plan: Plan,
    b: tuple[int, int],
    i: tuple[int, int],
    j: tuple[int, int],
    softcap: float = 0.0,
    tanh: list[Tensor] | None = None,
    spans: _Spans | None = None,
    small: bool = False,
) -> Tensor:
    """One tile's scores `(scale·q) kᵀ`, capped (`cap·tanh(s / cap)`, with `softcap`), plus
    the bias, in float32 (or wider), -inf where masked (or, with `spans`, in another
    document): `(bb·Hkv, n·G, kb)`. With a capped tile, `tanh` (a list) receives
    `tanh(s / cap)`, whose `1 - tanh²` the backward needs. `small`: the product as a broadcast
    multiply-and-sum (no thread pool; see `_attend_whole`)."""
    if small:
        s = (qt[:, :, None] * kt[:, None]).sum(dim=-1)  # (N, q, 1, D) · (N, 1, kb, D)
    else:
        s = torch.bmm(qt, kt.transpose(1, 2))
    if s.dtype != (acc := accumulator(s.dtype)):
        s = s.to(acc)
    if softcap:
        s = s.div_(softcap).tanh_()
        if tanh is not None:
            tanh.append(s.clone())
        s = s.mul_(softcap)
    n, G, kb = i[1] - i[0], plan.group, j[1] - j[0]
    if bias is not None or mask is not None:
        s5 = s.view(-1, plan.kv_heads, n, G, kb)
        if bias is not None:
            s5.add_(_tile(bias, b, i, j, plan.kv_heads))
        if mask is not None:
            s5.masked_fill_(~_tile(mask, b, i, j, plan.kv_heads), -math.inf)
    if spans is not None and spans.needs_mask(b, i, j[0]):
        s.view(-1, plan.kv_heads, n, G, kb).masked_fill_(~spans.mask(b, i, j), -math.inf)
    if (diagonal := _diagonal(plan, i, j)) is not None:
        # Only the columns ahead of the tile's first query hold masked scores; they get a
        # cached (n, 1, width) pattern, broadcast over the G heads of each row.
        column, first = diagonal
        ahead = _cached(_ahead_inf, n, kb - column, first, s.dtype, s.device)
        s.view(-1, n, G, kb)[..., column:].add_(ahead)
    if plan.window:
        # Key column c lies behind row r's window where j0 + c <= i0 + r + offset - window.
        last = i[0] + plan.offset - plan.window - j[0]
        if last >= -(n - 1):
            behind = _cached(_behind_inf, n, kb, last, s.dtype, s.device)
            s.view(-1, n, G, kb).add_(behind)
    return s


def _weights(
    s: Tensor, shift: Tensor, plan: Plan, i: tuple[int, int], j: tuple[int, int], guard: bool
) -> Tensor:
    """`exp(s - shift)` in place, at least `exp(exp_floor(s.dtype))`, and exactly 0 where `s`
    is -inf (a masked key)."""
    dead = torch.isneginf(s) if guard else None  # a mask or a bias may put -inf anywhere
    p = s.sub_(shift).clamp_(min=_cached(exp_floor, s.dtype)).exp_()
    if dead is not None:
        return p.masked_fill_(dead, 0.0)
    if (diagonal := _diagonal(plan, i, j)) is not None:
        column, first = diagonal
        n, kb = i[1] - i[0], j[1] - j[0]
        p.view(-1, n, plan.group, kb)[..., column:].mul_(
            _cached(_behind, n, kb - column, first, p.dtype, p.device)
        )
    return p


# ----------------------------------------------------------------------------- forward


def _attend(
    q5: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    causal: bool,
    key_block: int,
    scale: float,
    softcap: float,
    window: int,
    sinks: Tensor | None = None,
    stats: bool = True,
    documents: Tensor | None = None,
) -> list[Tensor]:
    """`[out (B, H, Sq, D), stat (B, Hkv, Sq, G, 1), *kept weights]` for q5 `(B, Hkv, Sq, G,
    D)` and k, v `(B, Hkv, Sk, D)`, in any strides. `stat` is each row's softmax denominator
    when the weights are kept, else its log-sum-exp; left unfilled when not `stats` (no
    backward will read it). With `sinks (H,)` and kept weights, the sink's weight of each row
    `(B, Hkv, Sq, G, 1)` follows the kept weights. With `documents (B, Sk)` (recomputing
    only), each query block starts at its first query's document."""
    plan = Plan.of(q5, k, causal, key_block, window, documents is not None)
    B, Hkv, Sq, G, D = q5.shape
    Sk, acc = plan.k_len, accumulator(q5.dtype)
    spans = None if documents is None else _Spans(documents, plan)
    # Rows may have every key (of a block) masked.
    guard = mask is not None or bias is not None or window > 0 or spans is not None
    out = q5.new_empty(B, Hkv * G, Sq, D)
    out5 = out.view(B, Hkv, G, Sq, D).transpose(2, 3)  # (B, Hkv, Sq, G, D), a view
    stat = q5.new_empty(B, Hkv, Sq, G, 1, dtype=acc)
    kept: list[Tensor] = []
    sink5 = None if sinks is None else sinks.to(acc).view(1, Hkv, 1, G, 1)
    sink_weight = q5.new_empty(B, Hkv, Sq, G, 1, dtype=acc) if sink5 is not None else None
    for b0, b1 in plan.batch_blocks():
        # (bb·Hkv, Sk, D) views when the strides allow, as for a batch row of the (B, T, H·D)
        # projections: the matmuls read them in place.
        kf, vf = k[b0:b1].reshape(-1, Sk, D), v[b0:b1].reshape(-1, Sk, D)
        for i0, i1, kbeg, kend in plan.query_blocks():
            if spans is not None:  # the keys before every query's document are skipped
                kbeg = min(max(kbeg, spans.first((b0, b1), i0)), kend)
            n = i1 - i0
            qt = q5[b0:b1, :, i0:i1].reshape(-1, n * G, D) * scale  # (bb·Hkv, n·G, D)
            m = total = o = sink = None
            if sink5 is not None:  # the sink: a key of every row with no value, seen first
                sink = sink5.expand(b1 - b0, Hkv, n, G, 1).reshape(-1, n * G, 1)
                m, total = sink, torch.ones_like(sink)
                o = qt.new_zeros(qt.shape, dtype=acc)
            for j0, j1 in plan.key_blocks(kbeg, kend):
                s = _scores(
                    qt, kf[:, j0:j1], bias, mask, plan, (b0, b1), (i0, i1), (j0, j1), softcap,
                    spans=spans,
                )
                block_max = s.amax(dim=-1, keepdim=True)  # (bb·Hkv, n·G, 1)
                new_max = block_max if m is None else torch.maximum(m, block_max)
                # A row with no key seen yet keeps max -inf: shift it by 0, so exp gives 0.
                shift = torch.where(new_max == -math.inf, 0.0, new_max) if guard else new_max
                p = _weights(s, shift, plan, (i0, i1), (j0, j1), guard)  # unnormalised
                pv = torch.bmm(p.to(v.dtype), vf[:, j0:j1])
                if m is None or total is None or o is None:
                    total, o = p.sum(dim=-1, keepdim=True), pv.to(acc)
                else:
                    rescale = torch.exp(m - shift)  # what the earlier blocks summed
                    total.mul_(rescale).add_(p.sum(dim=-1, keepdim=True))
                    o.mul_(rescale).add_(pv)
                m = new_max
                if plan.keep:
                    kept.append(p)
            assert m is not None and total is not None and o is not None
            # Rows with every key masked have total 0 and o 0: divide by 1, return zeros.
            safe = torch.where(total == 0, 1.0, total) if guard else total
            out5[b0:b1, :, i0:i1] = o.div_(safe).view(-1, Hkv, n, G, D)
            if not stats:
                continue
            if plan.keep:
                stat[b0:b1, :, i0:i1] = safe.view(-1, Hkv, n, G, 1)
                if sink is not None and sink_weight is not None:  # exp(sink - max) / total
                    weight = torch.exp(sink - m).div_(safe)
                    sink_weight[b0:b1, :, i0:i1] = weight.view(-1, Hkv, n, G, 1)
            else:  # log-sum-exp; +inf for empty rows, so that exp(s - lse) gives 0
                shift = torch.where(m == -math.inf, 0.0, m) if guard else m
                lse = torch.where(total > 0, shift + torch.log(total), math.inf)
                stat[b0:b1, :, i0:i1] = lse.view(-1, Hkv, n, G, 1)
    if sink_weight is not None and plan.keep:
        kept.append(sink_weight)
    return [out, stat, *kept]


def _attend_whole(
    q5: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    plan: Plan,
    scale: float,
    softcap: float,
    sinks: Tensor | None = None,
) -> Tensor:
    """`_attend`'s output for a call that is one tile (`plan.whole`) and keeps nothing for
    backward, e.g. a decoding step's one query: the same arithmetic without the tiling's
    bookkeeping, which costs more than the arithmetic at that size."""
    B, Hkv, Sq, G, D = q5.shape
    acc = accumulator(q5.dtype)
    guard = mask is not None or bias is not None or plan.window > 0
    rows, queries, keys = (0, B), (0, Sq), (0, plan.k_len)
    qt = q5.reshape(B * Hkv, Sq * G, D) * scale
    kt, vt = k.reshape(B * Hkv, -1, D), v.reshape(B * Hkv, -1, D)
    # A decoding step's few queries against a short cache: products this small run as
    # broadcast multiply-and-sum, on the calling thread; a BLAS batched matmul would wake the
    # thread pool for a few microseconds of work, and on a loaded machine the wake-up costs far
    # more than the arithmetic (hundreds of microseconds measured on 2 shared cores). Under a
    # dispatch mode (a FLOP counter) the matmuls run, which torch counts. Under torch.compile
    # a decoding step always takes the multiply-and-sum, whatever the cache's length (so no
    # guard on it): inductor fuses each into one loop of its own, faster than two batched
    # matmuls and the kernels between (at 576 cached keys, SmolLM2's 30 layers' attention took
    # 2.5 ms a token against 3.2, measured alone).
    # Only for one new query a row (decoding), judged per row: the broadcast sum's order of
    # addition follows the tensor's shape, so a window scored in a batch (`lmcore eval`) would
    # otherwise differ in the last bits from the same window alone.
    small = Sq == 1 and (
        torch.compiler.is_compiling()
        or (
            qt.numel() // B * plan.k_len < SERIAL_ELEMENTS
            and _get_current_dispatch_mode() is None
        )
    )
    s = _scores(qt, kt, bias, mask, plan, rows, queries, keys, softcap, small=small)
    top = s.amax(dim=-1, keepdim=True)
    sink = None
    if sinks is not None:  # (B·Hkv, Sq·G, 1): the sink of each row's head
        sink = sinks.to(acc).view(1, Hkv, 1, G, 1).expand(B, Hkv, Sq, G, 1)
        top = torch.maximum(top, sink := sink.reshape(B * Hkv, Sq * G, 1))
    shift = torch.where(top == -math.inf, 0.0, top) if guard else top
    p = _weights(s, shift, plan, queries, keys, guard)
    total = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - shift)
    if guard:  # rows with every key masked: divide by 1, return zeros
        total = torch.where(total == 0, 1.0, total)
    if small:  # (N, q, Sk, 1) · (N, 1, Sk, D), summed over the keys
        o = (p.to(v.dtype)[..., None] * vt[:, None]).sum(dim=2).to(acc).div_(total)
    else:
        o = torch.bmm(p.to(v.dtype), vt).to(acc).div_(total)
    return o.view(B, Hkv, Sq, G, D).transpose(2, 3).reshape(B, Hkv * G, Sq, D).to(q5.dtype)


@torch.library.custom_op("lmcore::tiled_attention", mutates_args=())
def _forward(
    q5: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
    sinks: Tensor | None, causal: bool, key_block: int, scale: float, softcap: float, window: int,
    documents: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    """`_attend` as one operator: autograd's node and torch.compile's opaque call."""
    return _attend(
        q5, k, v, bias, mask, causal, key_block, scale, softcap, window, sinks,
        documents=documents,
    )  # fmt: skip


@_forward.register_fake
def _(
    q5: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None,
    sinks: Tensor | None, causal: bool, key_block: int, scale: float, softcap: float, window: int,
    documents: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    plan = Plan.of(q5, k, causal, key_block, window)  # documents come only when nothing is kept
    B, Hkv, Sq, G, D = q5.shape
    acc = accumulator(q5.dtype)
    out = q5.new_empty(B, Hkv * G, Sq, D)
    stat = q5.new_empty(B, Hkv, Sq, G, 1, dtype=acc)
    kept = [q5.new_empty(shape, dtype=acc) for shape in plan.kept_shapes()]
    if sinks is not None and plan.keep:
        kept.append(q5.new_empty(B, Hkv, Sq, G, 1, dtype=acc))
    return [out, stat, *kept]


@register_flop_formula(torch.ops.lmcore.tiled_attention)
def _forward_flops(q5_shape: Any, k_shape: Any, *args: Any, **kwargs: Any) -> int:
    B, Hkv, Sq, G, D = q5_shape
    return int(4 * B * Hkv * G * Sq * k_shape[2] * D)  # q kᵀ and p v: the whole score matrix


# ----------------------------------------------------------------------------- backward


@torch.library.custom_op("lmcore::tiled_attention_backward", mutates_args=())
def _backward(
    dout: Tensor, q5: Tensor, k: Tensor, v: Tensor, out: Tensor, stat: Tensor,
    bias: Tensor | None, mask: Tensor | None, sinks: Tensor | None, kept: list[Tensor],
    causal: bool, key_block: int, scale: float, softcap: float, window: int, bias_grad: bool,
    documents: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    """`[dq5, dk, dv]`, plus the bias's gradient when `bias_grad`, then the sinks' when
    `sinks` is given."""
    plan = Plan.of(q5, k, causal, key_block, window, documents is not None)
    B, Hkv, Sq, G, D = q5.shape
    H, Sk, acc, low = plan.heads, plan.k_len, stat.dtype, q5.dtype
    spans = None if documents is None else _Spans(documents, plan)
    guard = mask is not None or bias is not None or window > 0 or spans is not None
    # Lower-precision q, k, v are widened once: the backward runs in float32 throughout.
    q5, k, v = q5.to(acc), k.to(acc), v.to(acc)
    # dO and delta = rowsum(dO ∘ O) in the tiles' (B, Hkv, Sq, G, ·) row order. With kept
    # weights both are divided by the softmax denominator, so that e / total never exists.
    dout5 = dout.view(B, Hkv, G, Sq, D).transpose(2, 3)
    delta = (dout.to(acc) * out.to(acc)).sum(dim=-1)  # (B, H, Sq)
    delta5 = delta.view(B, Hkv, G, Sq).transpose(2, 3).unsqueeze(-1)  # (B, Hkv, Sq, G, 1)
    dos = q5.new_empty(B, Hkv, Sq, G, D)
    dls = q5.new_empty(B, Hkv, Sq, G, 1)
    if plan.keep:
        torch.div(dout5, stat, out=dos)
        torch.div(delta5, stat, out=dls)
    else:
        dos.copy_(dout5)
        dls.copy_(delta5)
    dq5 = q5.new_empty(B, Hkv, Sq, G, D)
    dk = q5.new_zeros(B * Hkv, Sk, D)
    dv = q5.new_zeros(B * Hkv, Sk, D)
    sink_weight = None
    if sinks is not None and plan.keep:
        kept, sink_weight = kept[:-1], kept[-1]
    dbias5 = dbias = None
    if bias_grad:
        dbias = q5.new_zeros(B, H, Sq, Sk)
        dbias5 = dbias.view(B, Hkv, G, Sq, Sk).transpose(2, 3)  # (B, Hkv, Sq, G, Sk)
    weights = iter(kept)
    for b0, b1 in plan.batch_blocks():
        rows = slice(b0 * Hkv, b1 * Hkv)
        kf, vf = k[b0:b1].reshape(-1, Sk, D), v[b0:b1].reshape(-1, Sk, D)
        for i0, i1, kbeg, kend in plan.query_blocks():
            if spans is not None:  # as the forward tiled them
                kbeg = min(max(kbeg, spans.first((b0, b1), i0)), kend)
            n = i1 - i0
            qt = q5[b0:b1, :, i0:i1].reshape(-1, n * G, D)  # unscaled: scale goes on dk, dq
            do = dos[b0:b1, :, i0:i1].reshape(-1, n * G, D)
            dl = dls[b0:b1, :, i0:i1].reshape(-1, n * G, 1)
            dq = None
            for j0, j1 in plan.key_blocks(kbeg, kend):
                tile = (b0, b1), (i0, i1), (j0, j1)
                tanh: list[Tensor] = []
                if plan.keep:
                    p = next(weights)  # exp(s - max); do and dl carry the 1 / total
                    if softcap:  # the cap's derivative needs tanh(s / cap) again
                        raw = torch.bmm(qt * scale, kf[:, j0:j1].transpose(1, 2))
                        tanh.append(raw.div_(softcap).tanh_())
                else:
                    s = _scores(
                        qt * scale, kf[:, j0:j1], bias, mask, plan, *tile, softcap, tanh, spans
                    )
                    lse = stat[b0:b1, :, i0:i1].reshape(-1, n * G, 1)
                    p = _weights(s, lse, plan, (i0, i1), (j0, j1), guard)
                dv[rows, j0:j1].baddbmm_(p.transpose(1, 2), do)
                ds = torch.bmm(do, vf[:, j0:j1].transpose(1, 2)).sub_(dl).mul_(p)
                if dbias5 is not None:  # ds is the gradient of the (capped, biased) scores
                    dbias5[b0:b1, :, i0:i1, :, j0:j1] = ds.view(-1, Hkv, n, G, j1 - j0)
                if tanh:  # through cap·tanh(s / cap): times 1 - tanh²
                    ds.mul_(tanh[0].square_().neg_().add_(1))
                if dq is None:
                    dq = torch.bmm(ds, kf[:, j0:j1])
                else:
                    dq.baddbmm_(ds, kf[:, j0:j1])
                dk[rows, j0:j1].baddbmm_(ds.transpose(1, 2), qt, alpha=scale)
            assert dq is not None
            dq5[b0:b1, :, i0:i1] = dq.mul_(scale).view(-1, Hkv, n, G, D)
    grads = [dq5.to(low), dk.view(B, Hkv, Sk, D).to(low), dv.view(B, Hkv, Sk, D).to(low)]
    if dbias is not None:
        assert bias is not None
        grads.append(dbias.sum_to_size(bias.shape).to(bias.dtype))
    if sinks is not None:
        # out = Σ p_j v_j with the sink in every row's denominator: d out / d sink = -p_sink·out.
        if sink_weight is None:  # exp(sink - lse); +inf lse never occurs with a sink
            sink_weight = torch.exp(sinks.to(acc).view(1, Hkv, 1, G, 1) - stat)
        dsink = -(sink_weight * delta5).sum(dim=(0, 2, 4))  # (Hkv, G)
        grads.append(dsink.reshape(-1).to(sinks.dtype))
    return grads


@_backward.register_fake
def _(
    dout: Tensor, q5: Tensor, k: Tensor, v: Tensor, out: Tensor, stat: Tensor,
    bias: Tensor | None, mask: Tensor | None, sinks: Tensor | None, kept: list[Tensor],
    causal: bool, key_block: int, scale: float, softcap: float, window: int, bias_grad: bool,
    documents: Tensor | None,
) -> list[Tensor]:  # fmt: skip
    # Contiguous, as the real gradients are (empty_like would copy the inputs' strides).
    grads = [q5.new_empty(q5.shape), k.new_empty(k.shape), v.new_empty(v.shape)]
    if bias_grad:
        assert bias is not None
        grads.append(bias.new_empty(bias.shape))
    if sinks is not None:
        grads.append(sinks.new_empty(sinks.shape))
    return grads


@register_flop_formula(torch.ops.lmcore.tiled_attention_backward)
def _backward_flops(dout_shape: Any, q5_shape: Any, k_shape: Any, *args: Any, **kw: Any) -> int:
    return 2 * _forward_flops(q5_shape, k_shape)  # dv, dp, dq, dk: four matmuls the forward's size


# ----------------------------------------------------------------------------- autograd


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: list[Tensor]) -> None:
    q5, k, v, bias, mask, sinks, causal, key_block, scale, softcap, window, documents = inputs
    out, stat, *kept = output
    ctx.set_materialize_grads(False)  # only `out` gets a gradient
    ctx.causal, ctx.key_block = causal, key_block
    ctx.scale, ctx.softcap, ctx.window = scale, softcap, window
    # A mask, and a bias that needs no gradient, are inputs shared by every layer (pos=alibi
    # makes one bias per forward): held by reference, not counted as this layer's activations.
    ctx.bias, ctx.mask, ctx.documents = bias, mask, documents
    ctx.bias_grad = bias is not None and bias.requires_grad
    ctx.sinks = sinks is not None
    ctx.save_for_backward(q5, k, v, out, stat, *([sinks] if sinks is not None else []), *kept)


def _autograd_backward(ctx: Any, grads: list[Tensor | None]) -> tuple[Tensor | None, ...]:
    dout = grads[0]
    if dout is None:
        return (None,) * 12
    q5, k, v, out, stat, *kept = ctx.saved_tensors
    sinks = kept.pop(0) if ctx.sinks else None
    got = torch.ops.lmcore.tiled_attention_backward(
        dout, q5, k, v, out, stat, ctx.bias, ctx.mask, sinks, kept, ctx.causal, ctx.key_block,
        ctx.scale, ctx.softcap, ctx.window, ctx.bias_grad, ctx.documents,
    )  # fmt: skip
    dbias = got[3] if ctx.bias_grad else None
    dsinks = got[-1] if sinks is not None else None
    return got[0], got[1], got[2], dbias, None, dsinks, *(None,) * 6


torch.library.register_autograd(
    "lmcore::tiled_attention", _autograd_backward, setup_context=_setup_context
)


def _wants_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def tiled_attention(
    q: Float[Tensor, "B H Sq D"],
    k: Float[Tensor, "B Hkv Sk D"],
    v: Float[Tensor, "B Hkv Sk D"],
    *,
    causal: bool,
    mask: Bool[Tensor, "... Sq Sk"] | None = None,
    bias: Float[Tensor, "... Sq Sk"] | None = None,
    key_block: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    window: int | None = None,
    sinks: Float[Tensor, " H"] | None = None,
    documents: Int[Tensor, "B Sk"] | None = None,
) -> Float[Tensor, "B H Sq D"]:
    """`softmax(cap(scale · q kᵀ) + bias) v` in tiles (module docstring); `mask` True = may
    attend; `scale` defaults to 1 / sqrt(D); `softcap` caps the scores, `cap·tanh(s / cap)`;
    `window` lets a query see only its last `window` keys; `sinks` adds `exp(sinks[h])` to
    the softmax's denominator of head h; `documents` (the keys' document ids, non-decreasing
    along each row) lets a query see only the keys of its own document. `key_block=None` keeps
    each tile's weights for backward, an int recomputes them. When no gradient is wanted
    (inference), nothing needs keeping: a call whose scores fit one tile (a decoding step's
    few queries against the whole cache, `Plan.whole`) runs as one, and a larger one streams
    its keys in blocks of `STREAM_BLOCK` (`key_block`, an int, sets the block: `chunked`'s),
    so memory stays linear in the sequence.

    With `documents` and recomputed weights, each block of queries starts at its first query's
    document and blocks are at most `DOCUMENT_BLOCKS` key blocks long: the tiles wholly in
    other documents are never computed. With kept weights (whose shapes must follow from the
    shapes alone) the documents become a dense `(B, 1, Sq, Sk)` mask."""
    grad = _wants_grad(q, k, v, bias, sinks)
    B, H, Sq, D = q.shape
    Hkv = k.shape[1]
    if key_block is None and not grad:
        # All the keys in one block when that is one tile: a decoding step past STREAM_BLOCK
        # cached keys would otherwise walk them in blocks, in Python (and under torch.compile
        # as an opaque call), for a product of a few thousand scores.
        Sk = k.shape[2]
        whole = Plan(B, H, Hkv, Sq, Sk, D, causal, max(Sk, 1), int(window or 0)).whole
        key_block = max(Sk, 1) if whole else STREAM_BLOCK
    q5 = q.view(B, Hkv, H // Hkv, Sq, D).transpose(2, 3)  # (B, Hkv, Sq, G, D), a view
    factor = 1.0 / math.sqrt(D) if scale is None else float(scale)
    options = (factor, float(softcap or 0.0), int(window or 0))
    if documents is not None:
        plan = Plan.of(q5, k, causal, key_block or 0, options[2], True)
        if plan.keep or (not grad and plan.whole):  # the tiling must not depend on them
            from lmcore.model.documents import same_document

            same = same_document(documents, Sq)
            mask = same if mask is None else _as_4d(mask) & same
            documents = None
    args = (q5, k, v, _as_4d(bias), _as_4d(mask), sinks, causal, key_block or 0, *options)
    if not grad:
        # Without a gradient the operator has nothing to add: no autograd node, no softmax
        # statistics (only a backward reads them), no dispatcher round trip. A call that is
        # one tile (a decoding step's few queries) runs as plain operators, which
        # torch.compile traces and fuses; a larger one calls the tiling directly, except
        # under torch.compile, which keeps seeing one opaque operator there.
        plan = Plan.of(q5, k, causal, key_block or 0, options[2], documents is not None)
        if plan.whole and documents is None:
            return _attend_whole(*args[:5], plan, *options[:2], sinks)
        if not torch.compiler.is_compiling():
            return _attend(*args[:5], *args[6:], sinks, stats=False, documents=documents)[0]
    out: Tensor = _forward(*args, documents)[0]  # no defaults: autograd counts every input
    return out
