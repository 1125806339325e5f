"""Log-likelihoods of continuations, batched, with a shared context computed once.

    scores = loglikelihoods(model, [(context_ids, continuation_ids), ...], batch_size=8)
    scores[i] == (log p(continuation | context), whether greedy decoding gives it)

This is what lm-evaluation-harness asks a model for (`loglikelihood`, and the windows of
`loglikelihood_rolling`), scored as its Hugging Face backend scores them: the model sees
`(context + continuation)[-(context_length + 1):][:-1]` (long inputs lose tokens on the left),
and the continuation's tokens are scored from the last `len(continuation)` positions.

The tokens before those positions are the request's prefix. Requests that share a prefix (the
choices of one multiple-choice question) are scored through the KV cache: the prefix runs once,
its cache is copied to one row per request (`KVCache.select`), and the continuations run
against it. Several such groups share a batch, their prefixes left-padded and masked through the
attention kernel's `mask` contract (groups of equal prefix length only, for a kernel without
'mask'). Requests with a prefix of their own run whole, right-padded in batches (causal
attention keeps the pads out of every real position), as do all requests of a model with a
component that declares 'nocache'.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lmcore.errors import EvalError
from lmcore.model.cache import KVCache
from lmcore.model.generate import NOCACHE

if TYPE_CHECKING:
    from lmcore.model.transformer import TransformerLM

__all__ = ["loglikelihoods"]

Pair = tuple[Sequence[int], Sequence[int]]


@dataclass(frozen=True)
class _Item:
    index: int
    prefix: tuple[int, ...]  # inputs whose logits are not scored
    tail: list[int]  # inputs whose logits are scored
    targets: list[int]  # the continuation


def _items(pairs: Sequence[Pair], context_length: int) -> list[_Item]:
    out = []
    for i, (context, continuation) in enumerate(pairs):
        cont = list(continuation)
        if not context or not cont:
            raise EvalError(
                f"request {i}: a context and a continuation of at least one token each are "
                f"needed, got {len(context)} and {len(cont)}"
            )
        if len(cont) > context_length:
            raise EvalError(
                f"request {i}: its continuation of {len(cont)} tokens does not fit the "
                f"context_length={context_length} of the model"
            )
        inputs = [*context, *cont][-(context_length + 1) :][:-1]
        cut = len(inputs) - len(cont)
        out.append(_Item(i, tuple(inputs[:cut]), inputs[cut:], cont))
    return out


def target_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """`log softmax(logits)[target]` at every position, in float32, as `cross_entropy` computes
    it: the target's logit minus `logsumexp` (which subtracts the max, so nothing overflows)."""
    lf = logits.float()
    picked: Tensor = lf.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(lf, dim=-1)
    return picked


def _score(logits: Tensor, targets: list[int]) -> tuple[float, bool]:
    """`logits` (n, vocab) of the positions that predict `targets` (n)."""
    t = torch.tensor(targets, device=logits.device)
    picked = target_log_probs(logits, t)
    return float(picked.double().sum()), bool((logits.argmax(dim=-1) == t).all())


def _pad_right(rows: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    width = max(len(r) for r in rows)
    out = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out.to(device)


def _whole(
    model: TransformerLM, batch: Sequence[_Item], out: dict[int, tuple[float, bool]]
) -> None:
    """Each request's inputs as one row: right-padded, one forward."""
    device = model.lm_head.weight.device
    logits = model(_pad_right([[*it.prefix, *it.tail] for it in batch], device))
    for row, it in enumerate(batch):
        start = len(it.prefix)
        out[it.index] = _score(logits[row, start : start + len(it.tail)], it.targets)


def _shared(
    model: TransformerLM, groups: Sequence[list[_Item]], out: dict[int, tuple[float, bool]]
) -> None:
    """Each group's prefix once (left-padded), then every member's tail against its copy."""
    device = model.lm_head.weight.device
    longest = max(len(g[0].prefix) for g in groups)
    ids = torch.zeros(len(groups), longest, dtype=torch.long)
    real = torch.zeros(len(groups), longest, dtype=torch.bool)
    for b, g in enumerate(groups):
        p = g[0].prefix
        ids[b, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
        real[b, longest - len(p) :] = True
    cache = KVCache.for_model(model, len(groups))
    if not bool(real.all()):
        cache.pad(real)
    model(ids.to(device), cache=cache)
    members = [it for g in groups for it in g]
    rows = torch.tensor([b for b, g in enumerate(groups) for _ in g], dtype=torch.long)
    fork = cache.select(rows)
    logits = model(_pad_right([it.tail for it in members], device), cache=fork)
    for row, it in enumerate(members):
        out[it.index] = _score(logits[row, : len(it.tail)], it.targets)


def _packs(
    groups: list[list[_Item]], batch_size: int, context_length: int, masked: bool
) -> Iterator[list[list[_Item]]]:
    """Consecutive groups per batch: at most `batch_size` requests, room in the cache for the
    longest prefix and tail together, and one prefix length unless the kernel masks pads."""
    pack: list[list[_Item]] = []
    count = prefix = tail = 0
    for g in groups:
        p, t = len(g[0].prefix), max(len(it.tail) for it in g)
        fits = (
            count + len(g) <= batch_size
            and max(prefix, p) + max(tail, t) <= context_length
            and (masked or p == prefix)
        )
        if pack and not fits:
            yield pack
            pack, count, prefix, tail = [], 0, 0, 0
        pack.append(g)
        count, prefix, tail = count + len(g), max(prefix, p), max(tail, t)
    if pack:
        yield pack


@torch.inference_mode()
def loglikelihoods(
    model: TransformerLM,
    pairs: Sequence[Pair],
    *,
    batch_size: int = 8,
    cache: bool | None = None,
    progress: bool | None = False,
) -> list[tuple[float, bool]]:
    """`(log-likelihood, is greedy)` of each `(context, continuation)` pair of token ids (see
    the module's docstring). `cache`: share prefixes through the KV cache (None: unless a
    component declares 'nocache'). `progress`: a tqdm bar on stderr (None: when a terminal)."""
    from tqdm import tqdm

    if batch_size < 1:
        raise EvalError(f"batch_size must be a positive integer, got {batch_size}")
    bp, L = model.blueprint, model.spec.context_length
    if cache is None:
        cache = not any(NOCACHE in bp.features(kind) for kind in bp.entries)
    items = _items(pairs, L)
    by_prefix: dict[tuple[int, ...], list[_Item]] = {}
    for it in items:
        by_prefix.setdefault(it.prefix if cache and it.prefix else (-1 - it.index,), []).append(it)
    alone = [g[0] for g in by_prefix.values() if len(g) == 1]
    groups = [
        g[i : i + batch_size] for g in by_prefix.values() if len(g) > 1
        for i in range(0, len(g), batch_size)
    ]  # fmt: skip
    # Longest first: the padding within a batch is small, and memory runs out at once if at all.
    alone.sort(key=lambda it: (-(len(it.prefix) + len(it.tail)), it.index))
    groups.sort(key=lambda g: (-len(g[0].prefix), -max(len(it.tail) for it in g), g[0].index))
    out: dict[int, tuple[float, bool]] = {}
    disable = not sys.stderr.isatty() if progress is None else not progress
    with tqdm(total=len(items), unit="request", file=sys.stderr, disable=disable) as bar:
        masked = bp.padding() is None
        for pack in _packs(groups, batch_size, L, masked):
            _shared(model, pack, out)
            bar.update(sum(len(g) for g in pack))
        for i in range(0, len(alone), batch_size):
            _whole(model, alone[i : i + batch_size], out)
            bar.update(len(alone[i : i + batch_size]))
    return [out[i] for i in range(len(items))]
