"""The conformance checks of attention kernels (registered with `core.check`, like the others
that `lmcore.testing.checks` gathers): the kit's float64 reference, stability, causality, masks,
biases, grouped-query heads, and the query scale, soft-capping, sliding window and attention
sinks a kernel declares.

Kernels are compared with `reference_attention`, written here plainly in float64 with an
explicit mask, independent of lmcore's own kernels: a bug shared by lmcore.model.nn and a kernel
built on it cannot hide on both sides, and the kit never compares a kernel with itself.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor, nn

from lmcore.testing.core import (
    ATTN_LENGTHS,
    BATCH,
    CHANGED,
    DTYPES,
    SEQ,
    SHAPES,
    Settings,
    Target,
    check,
    fail,
    make_inputs,
    mismatch,
    shape_of,
    tolerance,
)


def reference_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    window: int | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """`softmax(cap(scale · q kᵀ) + bias) v` in float64 (`scale` 1 / sqrt(D) by default;
    `cap(s) = softcap · tanh(s / softcap)` when given), written out step by step and sharing no
    code with lmcore's kernels: k, v repeated to q's heads (head h uses kv head h // group),
    masked keys, with `causal` keys after the query's position (query i sits at Sk - Sq + i,
    aligned to the end), and with `window` keys `window` or more positions behind it get no
    weight; a query with no visible key gets zeros; `sinks (H,)` adds `exp(sinks[h])` to each
    row's denominator (gpt-oss). The softmax subtracts each row's maximum (the sink's included),
    so it stays exact for scores far beyond exp's range. Differentiable (for the gradient
    checks): pass tensors that require grad."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double(), v.double()
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    factor = 1.0 / math.sqrt(d) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * factor  # (B, H, Sq, Sk)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.double()
    keep = torch.ones(sq, sk, dtype=torch.bool)
    position = torch.arange(sq)[:, None] + (sk - sq)  # each query's position among the keys
    if causal:
        keep = torch.arange(sk)[None, :] <= position
    if window:
        keep = keep & (torch.arange(sk)[None, :] > position - window)
    if mask is not None:
        keep = keep & mask
    scores = torch.where(keep, scores, -math.inf)
    top = scores.amax(dim=-1, keepdim=True)
    sink = None
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1)
        top = torch.maximum(top, sink)
    top = torch.where(torch.isfinite(top), top, 0.0)  # a row with no visible key
    weights = torch.exp(scores - top)  # (..., Sq, Sk), every entry in [0, 1]
    total = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - top)
    return (weights / torch.where(total > 0, total, 1.0)) @ v


def _attend(module: nn.Module, q: Tensor, k: Tensor, v: Tensor, **kw: Any) -> Tensor:
    """Call a kernel, passing mask / bias only when given (as the model does)."""
    extra = {name: t for name, t in kw.items() if name in ("mask", "bias") and t is not None}
    out: Tensor = module(q, k, v, causal=kw["causal"], **extra)
    return out


@check("reference", ("attn",), variants=("float32", "bfloat16"))
def reference(target: Target, variant: str, settings: Settings) -> None:
    """Matches the reference kernel on random inputs, causal or not, for Sq = Sk and Sq < Sk."""
    dtype = DTYPES[variant]
    atol, rtol = tolerance(dtype)
    module = target.build(dtype=dtype)
    for (sq, sk), causal in itertools.product(ATTN_LENGTHS, (False, True)):
        i = make_inputs(target, dtype, seq=sq, kv_seq=sk)
        out = _attend(module, i["q"], i["k"], i["v"], causal=causal)
        expected = reference_attention(i["q"], i["k"], i["v"], causal=causal)
        problem = mismatch(out, expected, atol=atol, rtol=rtol)
        if problem:
            fail(
                f"causal={causal}, Sq={sq}, Sk={sk}, {variant}: the output differs from the "
                f"kit's float64 reference, softmax(q kᵀ / sqrt(D)) v: {problem}"
            )


# How far the stability check scales q and k: q·k / sqrt(D) then spreads over about ±1000,
# far beyond exp's float32 range (exp(89) is inf), as in a trained model's sharp attention.
LARGE = 30.0


@check("stability", ("attn",))
def stability(target: Target, variant: str, settings: Settings) -> None:
    """Large logits (q and k scaled by 30, scores of several hundred) give finite outputs equal to
    the float64 reference: the softmax must subtract each row's maximum before exp."""
    module = target.build()
    for (sq, sk), causal in itertools.product(ATTN_LENGTHS, (False, True)):
        i = make_inputs(target, seq=sq, kv_seq=sk)
        q, k = LARGE * i["q"], LARGE * i["k"]
        with torch.no_grad():
            out = _attend(module, q, k, i["v"], causal=causal)
        expected = reference_attention(q, k, i["v"], causal=causal)
        bad = ~torch.isfinite(out)
        if bool(bad.any()):
            fail(
                f"with q and k scaled by {LARGE:g} (causal={causal}, Sq={sq}, Sk={sk}), "
                f"{int(bad.sum())} of {bad.numel()} outputs are NaN or inf where the float64 "
                "reference is finite: subtract each row's maximum score before exp (softmax is "
                "unchanged by the shift)"
            )
        problem = mismatch(out, expected, *tolerance(torch.float32))
        if problem:
            fail(
                f"with q and k scaled by {LARGE:g} (causal={causal}, Sq={sq}, Sk={sk}), the "
                f"output differs from the float64 reference: {problem}"
            )


@check("causal", ("attn",))
def causal(target: Target, variant: str, settings: Settings) -> None:
    """With causal=True, query i (at position Sk - Sq + i) sees exactly keys 0 .. Sk - Sq + i:
    perturbing later keys/values never changes it, perturbing the visible ones does."""
    module = target.build()
    for sq, sk in ATTN_LENGTHS:
        i = make_inputs(target, seq=sq, kv_seq=sk)
        q, k, v = i["q"], i["k"], i["v"]
        with torch.no_grad():
            base = module(q, k, v, causal=True)
            for cut in range(1, sk):
                k2, v2 = k.clone(), v.clone()
                k2[..., cut:, :] += torch.randn_like(k2[..., cut:, :])
                v2[..., cut:, :] += torch.randn_like(v2[..., cut:, :])
                moved = (module(q, k2, v2, causal=True) - base).abs().amax(dim=(0, 1, 3))  # (Sq,)
                for query, change in enumerate(moved.tolist()):
                    _causal_verdict(query, sk - sq + query, cut, change, sq, sk)


def _causal_verdict(query: int, position: int, cut: int, change: float, sq: int, sk: int) -> None:
    where = f"with Sq={sq}, Sk={sk}, query {query} (position {position})"
    if position < cut and change > CHANGED:
        fail(
            f"causal=True leaks future tokens: {where} changed by {change:.3g} when keys/values "
            f"from position {cut} on were perturbed; query i may attend only keys "
            f"j <= Sk - Sq + i (here {position}), queries aligned to the end of the keys"
        )
    if position >= cut and not change > CHANGED:
        fail(
            f"causal=True hides visible tokens: {where} did not change when keys/values from "
            f"position {cut} on were perturbed, yet it may attend keys up to {position}; the "
            "mask must be j <= Sk - Sq + i (aligned to the end, including the query's own "
            "position)"
        )


@check("mask", ("attn",), feature="mask")
def mask(target: Target, variant: str, settings: Settings) -> None:
    """A boolean mask (True = may attend), alone or with causal=True, gives the reference output."""
    module = target.build()
    heads = shape_of(target)["num_heads"]
    for (sq, sk), causal, layout in itertools.product(
        ATTN_LENGTHS, (False, True), ("Sq, Sk", "B, 1, Sq, Sk", "B, H, Sq, Sk")
    ):
        shape = {"Sq, Sk": (sq, sk), "B, 1, Sq, Sk": (BATCH, 1, sq, sk)}.get(
            layout, (BATCH, heads, sq, sk)
        )
        keep = torch.rand(shape) > 0.5
        rows = torch.arange(sq)
        keep[..., rows, rows + sk - sq] = True  # each query may see its own position: no empty row
        i = make_inputs(target, seq=sq, kv_seq=sk)
        out = _attend(module, i["q"], i["k"], i["v"], causal=causal, mask=keep)
        expected = reference_attention(i["q"], i["k"], i["v"], causal=causal, mask=keep)
        problem = mismatch(out, expected, *tolerance(torch.float32))
        if problem:
            fail(
                f"with a ({layout}) boolean mask, causal={causal}, Sq={sq}, Sk={sk}: the output "
                f"differs from the reference: {problem}. lmcore masks are True where a query "
                "MAY attend; False positions get -inf before the softmax"
            )


@check("bias", ("attn",), feature="bias")
def bias(target: Target, variant: str, settings: Settings) -> None:
    """An additive bias broadcastable to (B, H, Sq, Sk) is added to the scaled scores."""
    module = target.build()
    heads = shape_of(target)["num_heads"]
    for (sq, sk), causal in itertools.product(ATTN_LENGTHS, (False, True)):
        for shape in ((sq, sk), (heads, sq, sk), (BATCH, 1, sq, sk), (BATCH, heads, sq, sk)):
            add = 2.0 * torch.randn(shape)
            i = make_inputs(target, seq=sq, kv_seq=sk)
            out = _attend(module, i["q"], i["k"], i["v"], causal=causal, bias=add)
            expected = reference_attention(i["q"], i["k"], i["v"], causal=causal, bias=add)
            problem = mismatch(out, expected, *tolerance(torch.float32))
            if problem:
                fail(
                    f"with a bias of shape {shape}, causal={causal}, Sq={sq}, Sk={sk}: the output "
                    f"differs from softmax(q kᵀ / sqrt(D) + bias) v: {problem}"
                )


def _option_case(
    target: Target, option: str, value: float, sq: int, sk: int, causal: bool, large: float = 1.0
) -> None:
    """The kernel with `option=value` against the float64 reference, output and gradients."""
    module = target.build()
    i = make_inputs(target, seq=sq, kv_seq=sk)
    q, k, v = large * i["q"], large * i["k"], i["v"]
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = module(q, k, v, causal=causal, **{option: value})
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    options: dict[str, Any] = {option: value}
    expected = reference_attention(*refs, causal=causal, **options)
    what = f"with {option}={value!r} (causal={causal}, Sq={sq}, Sk={sk})"
    problem = mismatch(out, expected, *tolerance(torch.float32))
    if problem:
        fail(f"{what}, the output differs from the float64 reference: {problem}")
    cotangent = torch.randn(out.shape)
    torch.autograd.backward((out.float() * cotangent).sum())
    torch.autograd.backward((expected * cotangent.double()).sum())
    for name, got, ref in zip("qkv", (q, k, v), refs, strict=True):
        assert got.grad is not None and ref.grad is not None
        problem = mismatch(got.grad, ref.grad, atol=1e-4, rtol=1e-3)
        if problem:
            fail(f"{what}, the gradient of {name} differs from the float64 reference's: {problem}")


@check("scale", ("attn",), feature="scale")
def scale(target: Target, variant: str, settings: Settings) -> None:
    """`scale=s` multiplies q kᵀ by s instead of 1 / sqrt(D) (output and gradients)."""
    for (sq, sk), causal, factor in itertools.product(ATTN_LENGTHS, (False, True), (0.05, 0.5)):
        _option_case(target, "scale", factor, sq, sk, causal)


@check("softcap", ("attn",), feature="softcap")
def softcap(target: Target, variant: str, settings: Settings) -> None:
    """`softcap=c` caps the scores to c·tanh(s / c) before the softmax (output and gradients),
    tried with large logits so that the cap bites."""
    for (sq, sk), causal, cap in itertools.product(ATTN_LENGTHS, (False, True), (5.0, 50.0)):
        _option_case(target, "softcap", cap, sq, sk, causal, large=LARGE)


@check("window", ("attn",), feature="window")
def window(target: Target, variant: str, settings: Settings) -> None:
    """`window=w`: the query at position p sees only keys p - w + 1 .. p (and, causal, none
    after it), output and gradients, for Sq = Sk and Sq < Sk."""
    for (sq, sk), causal, w in itertools.product(ATTN_LENGTHS, (False, True), (1, 3, 2 * SEQ)):
        _option_case(target, "window", w, sq, sk, causal)


@check("sinks", ("attn",), feature="sinks")
def sinks(target: Target, variant: str, settings: Settings) -> None:
    """`sinks=s` (one logit per query head) joins every row's softmax as a key with no value,
    `exp(s_j) / (Σ exp(s_i) + exp(sink))` (gpt-oss), output and the gradients of q, k, v and
    the sinks, with sinks far above and below the scores."""
    heads = shape_of(target)["num_heads"]
    for (sq, sk), causal in itertools.product(ATTN_LENGTHS, (False, True)):
        module = target.build()
        i = make_inputs(target, seq=sq, kv_seq=sk)
        q, k, v = (i[n].detach().requires_grad_() for n in "qkv")
        logits = torch.linspace(-30.0, 30.0, heads).requires_grad_()
        out = module(q, k, v, causal=causal, sinks=logits)
        refs = [t.detach().double().requires_grad_() for t in (q, k, v, logits)]
        expected = reference_attention(*refs[:3], causal=causal, sinks=refs[3])
        given = [round(x, 2) for x in logits.tolist()]
        what = f"with sinks={given} (causal={causal}, Sq={sq}, Sk={sk})"
        problem = mismatch(out, expected, *tolerance(torch.float32))
        if problem:
            fail(f"{what}, the output differs from the float64 reference: {problem}")
        cotangent = torch.randn(out.shape)
        torch.autograd.backward((out.float() * cotangent).sum())
        torch.autograd.backward((expected * cotangent.double()).sum())
        for name, got, ref in zip(("q", "k", "v", "sinks"), (q, k, v, logits), refs, strict=True):
            if got.grad is None:
                fail(f"{what}, {name} gets no gradient: the sinks are learned")
            assert ref.grad is not None
            problem = mismatch(got.grad, ref.grad, atol=1e-4, rtol=1e-3)
            if problem:
                fail(f"{what}, the gradient of {name} differs from the float64 reference's: "
                     f"{problem}")  # fmt: skip


@check("gqa", ("attn",), feature="gqa")
def gqa(target: Target, variant: str, settings: Settings) -> None:
    """With Hkv < H key/value heads, query head h uses kv head h // (H / Hkv), with or without
    per-head masks and biases."""
    s = SHAPES[0]
    heads, d = s["num_heads"], s["head_dim"]
    for kv_heads, (sq, sk), causal in itertools.product(
        (heads // 2, 1), ATTN_LENGTHS, (False, True)
    ):
        module = target.build(num_kv_heads=kv_heads)
        q = torch.randn(BATCH, heads, sq, d)
        k, v = torch.randn(BATCH, kv_heads, sk, d), torch.randn(BATCH, kv_heads, sk, d)
        extra: dict[str, Tensor | None] = {"mask": None, "bias": None}
        if "bias" in target.features:
            extra["bias"] = torch.randn(BATCH, heads, sq, sk)
        if "mask" in target.features:
            keep = torch.rand(BATCH, heads, sq, sk) > 0.5
            keep[..., torch.arange(sq), torch.arange(sq) + sk - sq] = True
            extra["mask"] = keep
        out = _attend(module, q, k, v, causal=causal, **extra)
        expected = reference_attention(
            q, k, v, causal=causal, mask=extra["mask"], bias=extra["bias"]
        )
        problem = mismatch(out, expected, *tolerance(torch.float32))
        if problem:
            given = ", ".join(f"per-head {n}" for n, t in extra.items() if t is not None)
            fail(
                f"with {heads} query heads and {kv_heads} kv heads ({given or 'no mask or bias'},"
                f" causal={causal}, Sq={sq}, Sk={sk}): the output differs from the reference "
                f"with k, v repeated per group (query head h uses kv head h // "
                f"{heads // kv_heads}, as repeat_interleave): {problem}"
            )
