"""A component beyond one eager forward: under `torch.compile` (`compile`, for a component that
declares 'compile') and, in a small model around it, with a KV cache fed a prompt, a chunk and
single tokens, and a left-padded row (`cache`; unless it declares 'nocache'), and with a packed
row of documents, none of which sees another (`documents`; a kernel or mixer that declares
'documents', and every positional encoding).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lmcore.components import KINDS
from lmcore.testing.core import (
    BATCH,
    CHANGED,
    SHAPES,
    Settings,
    Target,
    check,
    fail,
    first_line,
    make_inputs,
    mismatch,
    model_around,
    model_buildable,
    output_names,
    run,
    tolerance,
)

if TYPE_CHECKING:
    from lmcore.model.transformer import TransformerLM


@check("compile", KINDS, feature="compile", defaults_only=True)
def compiled(target: Target, variant: str, settings: Settings) -> None:
    """torch.compile runs the forward and matches eager (the component declares 'compile')."""
    module = target.build()
    inputs = make_inputs(target)
    with torch.no_grad():
        eager = run(target.kind, module, inputs)

    def forward(inputs: Mapping[str, Tensor]) -> list[Tensor]:
        return run(target.kind, module, inputs)

    backend = settings.compile_backend
    torch.compiler.reset()  # earlier components' graphs must not count towards recompile limits
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch's own deprecation notices from inside the compiler are not the plugin's.
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.")
            got = torch.compile(forward, backend=backend)(inputs)
    except Exception as e:
        fail(
            f"torch.compile(backend={backend!r}) failed: {type(e).__name__}: {first_line(e)}; "
            "make the forward traceable, or drop 'compile' from the Component's features"
        )
    finally:
        torch.compiler.reset()
    atol, rtol = tolerance(torch.float32)
    names = output_names(target.kind, module, inputs)
    for name, e_out, c_out in zip(names, eager, got, strict=True):
        problem = mismatch(c_out, e_out, atol=atol, rtol=rtol, equal_nan=True)
        if problem:
            fail(f"compiled with backend={backend!r}, {name} differs from eager: {problem}")


# Token counts fed to a cached model in turn: a prompt, then a chunk (Sq > 1 queries against
# more keys), then single tokens as in decoding.
CACHE_STEPS = (5, 2, 1, 1)
# A left-padded row: this many pads before its prompt (needs an attn with 'mask').
CACHE_PADS = 2


@check("cache", KINDS, defaults_only=True, needs=model_buildable)
def cache(target: Target, variant: str, settings: Settings) -> None:
    """With a KV cache, a model around the component gives the logits of a full forward, fed a
    prompt, a chunk and single tokens, at two shapes (the second with grouped-query heads), and
    for a left-padded row when the kernel takes a mask; unless it declares 'nocache'."""
    from lmcore.errors import LmcoreError
    from lmcore.model.cache import KVCache
    from lmcore.model.transformer import TransformerLM

    if "nocache" in target.features:
        return  # declared: generation refuses it before starting
    for shape in range(len(SHAPES)):
        spec = model_around(target, shape)
        try:
            model = TransformerLM(spec, registry=target.registry)
        except (LmcoreError, RuntimeError, TypeError, ValueError) as e:
            fail(f"cannot build the model {spec!r}: {type(e).__name__}: {first_line(e)}")
        total = sum(CACHE_STEPS)
        ids = torch.randint(0, 97, (BATCH, total))
        padded = model.blueprint.padding() is None
        with torch.no_grad():
            full = model(ids)  # (B, total, V)
            kv = KVCache.for_model(model, BATCH)
            start = 0
            for n in CACHE_STEPS:
                got = model(ids[:, start : start + n], cache=kv)
                problem = mismatch(got, full[:, start : start + n], 1e-4, 1e-4)
                if problem:
                    fail(
                        f"in the model {spec!r} with a KV cache, {n} new token(s) after "
                        f"{start} cached ones (attn gets Sq={n}, Sk={start + n}) do not give "
                        f"the logits of a full forward: {problem}. The kernel must align causal "
                        "queries to the end of the keys (query i at position Sk - Sq + i), and "
                        "the pos hooks use the positions they are given (embed and rotation: "
                        "the new tokens'; attention_bias: (q_positions, k_positions)); or "
                        "declare 'nocache' in the Component's features"
                    )
                start += n
            if padded:
                _padded_cache(model, spec, ids, full)


def _padded_cache(model: TransformerLM, spec: str, ids: Tensor, full: Tensor) -> None:
    """Row 0 left-padded by CACHE_PADS, row 1 not: both give their unpadded logits."""
    from lmcore.model.cache import KVCache

    prompt = CACHE_STEPS[0]
    short = ids.clone()
    short[0, CACHE_PADS:prompt] = ids[0, : prompt - CACHE_PADS]  # row 0's prompt, shifted right
    short[0, :CACHE_PADS] = 0
    real = torch.ones(BATCH, prompt, dtype=torch.bool)
    real[0, :CACHE_PADS] = False
    alone = model(ids[:1, : prompt - CACHE_PADS])  # row 0 unpadded, shorter
    kv = KVCache.for_model(model, BATCH)
    kv.pad(real)
    got = model(short[:, :prompt], cache=kv)
    for what, a, e in (
        ("the padded row", got[0, CACHE_PADS:], alone[0]),
        ("the unpadded row beside it", got[1], full[1, :prompt]),
    ):
        problem = mismatch(a, e, 1e-4, 1e-4)
        if problem:
            fail(
                f"in the model {spec!r} with a KV cache and a left-padded batch (row 0 has "
                f"{CACHE_PADS} pads, masked through the kernel's mask), {what} does not give "
                f"its logits without padding: {problem}. Pads are masked keys (mask=False); "
                "their positions do not count; a recurrent mixer leaves its state as it was "
                "where cache.valid is False"
            )


# A packed row's documents, as token counts: every shape's context holds them, and the middle
# one is longer than a convolution's taps and several attention tiles of the kit's kernels.
DOCUMENT_LENGTHS = (5, 9, 4)


@check("documents", ("attn", "pos", "mixer"), defaults_only=True, needs=model_buildable)
def documents(target: Target, variant: str, settings: Settings) -> None:
    """In a packed row of documents (`model(ids, documents=...)`), changing one document's
    tokens changes no logit of any other document, and each document's logits are those it
    gives alone (positions restart at 0 at its first token), at two shapes; for every
    positional encoding, and every kernel and mixer that declares 'documents' (one that does
    not is refused by name)."""
    from lmcore.errors import LmcoreError
    from lmcore.model.transformer import TransformerLM

    if target.kind in ("attn", "mixer") and "documents" not in target.features:
        return  # declared: a document-masked forward refuses it by name
    spans = []
    for length in DOCUMENT_LENGTHS:
        start = spans[-1][1] if spans else 0
        spans.append((start, start + length))
    total = spans[-1][1]
    docs = torch.cat([torch.full((n,), d) for d, n in enumerate(DOCUMENT_LENGTHS)])
    docs = docs.expand(BATCH, total)
    for shape in range(len(SHAPES)):
        spec = model_around(target, shape)
        try:
            model = TransformerLM(spec, registry=target.registry)
        except (LmcoreError, RuntimeError, TypeError, ValueError) as e:
            fail(f"cannot build the model {spec!r}: {type(e).__name__}: {first_line(e)}")
        ids = torch.randint(0, 97, (BATCH, total))
        changed = ids.clone()
        a, b = spans[1]
        changed[:, a:b] = (ids[:, a:b] + torch.randint(1, 97, (BATCH, b - a))) % 97
        with torch.no_grad():
            try:
                base = model(ids, documents=docs)
            except (LmcoreError, RuntimeError, TypeError, ValueError) as e:
                fail(f"in the model {spec!r}, a forward with documents failed: "
                     f"{type(e).__name__}: {first_line(e)}")  # fmt: skip
            moved = model(changed, documents=docs)
            for d, (s, e) in enumerate(spans):
                if d == 1:
                    continue
                leak = (moved[:, s:e] - base[:, s:e]).abs().max().item()
                if leak > CHANGED:
                    fail(
                        f"in the model {spec!r}, a packed row of documents "
                        f"{_spans_text(spans)}: changing the tokens of document 1 changed the "
                        f"logits of document {d} by {leak:.3g}: information crosses a document "
                        "boundary. A kernel with 'documents' lets a query see only the keys of "
                        "its own document (documents=, the keys' (B, Sk) ids); a mixer with it "
                        "resets its state and convolution at each document's first token "
                        "(context.documents)"
                    )
            if not (moved[:, a:b] - base[:, a:b]).abs().max().item() > CHANGED:
                fail(f"in the model {spec!r}, changing the tokens of document 1 left its own "
                     "logits unchanged")  # fmt: skip
            for d, (s, e) in enumerate(spans):
                problem = mismatch(base[:, s:e], model(ids[:, s:e]), 1e-4, 1e-4)
                if problem:
                    fail(
                        f"in the model {spec!r}, document {d} of a packed row "
                        f"{_spans_text(spans)} does not give the logits it gives alone: "
                        f"{problem}. Its positions restart at 0 at its first token (the pos "
                        "hooks use the positions they are given), and it sees nothing of the "
                        "documents before it"
                    )


def _spans_text(spans: list[tuple[int, int]]) -> str:
    return "(" + ", ".join(f"{s}..{e - 1}" for s, e in spans) + ")"
