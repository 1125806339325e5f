"""The token mixers' own contract: causal (`mixes_causally`); decoding one token at a time, and after a
prefill, gives the parallel forward's outputs and leaves the same state (`recurrent`); the
declared decoding state is the bytes `decoding_state` allocates (`state`).

A mixer is checked as a model holds it: built in a one-layer model around it (so that
`attention()` builds lmcore's attention sub-layer), fed the context the model gives it (the
positional rotation and bias of its positions).

Tolerances. `recurrent` compares in float64 at atol 1e-8, rtol 1e-7: a chunked (parallel) form
and a per-token recurrence compute the same sums in another order and with the decays as
products of exponentials or as exponentials of sums; over the kit's few dozen tokens that
differs by ~1e-14 in float64, so anything above 1e-8 is a different formula, not rounding. The
model-level `cache` check holds float32 logits to 1e-4 (float32 round-off, ~1e-7 relative,
compounded over two layers and a 97-way head).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lmcore.interfaces import DecodingState, LayerContext
from lmcore.testing.core import (
    BATCH,
    CHANGED,
    DTYPES,
    SEQ,
    Settings,
    Target,
    attention_paths,
    call,
    check,
    fail,
    first_line,
    mismatch,
    model_around,
    model_buildable,
    positions,
)

if TYPE_CHECKING:
    from lmcore.model.transformer import TransformerLM

RECURRENT_TOL = (1e-8, 1e-7)  # (atol, rtol) in float64; see the module docstring
# Token counts of a prefill and the chunks after it, as a cached forward is fed them.
PREFILL_STEPS = (5, 3, 1, 1)


def _model(target: Target, dtype: torch.dtype, shape: int = 0) -> TransformerLM:
    from lmcore.errors import LmcoreError
    from lmcore.model.transformer import TransformerLM

    spec = model_around(target, shape, num_layers=1)
    try:
        return TransformerLM(spec, registry=target.registry, dtype=dtype)
    except (LmcoreError, RuntimeError, TypeError, ValueError) as e:
        fail(f"cannot build the model {spec!r}: {type(e).__name__}: {first_line(e)}")


def _context(model: TransformerLM, p: Tensor, keys: Tensor, cache: Any = None) -> LayerContext:
    """What the model hands layer 0 for tokens at positions `p` after keys at `keys`."""
    pos = model.pos
    return LayerContext(pos.rotation(p), pos.attention_bias(p, keys), None, cache, positions=p)


def _state_of(mixer: Any, name: str, batch: int, context: int, dtype: torch.dtype) -> Any:
    make = getattr(mixer, "decoding_state", None)
    if make is None:
        fail(
            f"the module has no decoding_state(*, batch, context_length, device, dtype): a "
            f"mixer that decodes with a cache makes its state there; or declare 'nocache' "
            f"({name})"
        )
    state = make(batch=batch, context_length=context, device=None, dtype=dtype)
    if not isinstance(state, DecodingState):
        fail(
            f"decoding_state returned a {type(state).__name__}, not a "
            "lmcore.interfaces.DecodingState (rewind, select(rows), tensors()); use "
            "lmcore.model.cache.RecurrentState, ContextState or KVState"
        )
    return state


@check("mixes_causally", ("mixer",), needs=model_buildable)
def mixes_causally(target: Target, variant: str, settings: Settings) -> None:
    """No output depends on a later token: changing the inputs from a position on leaves every
    output before it as it was, and changes the outputs there."""
    model = _model(target, torch.float32)
    mixer = model.layers[0].attn
    x = torch.randn(BATCH, 2 * SEQ, model.spec.d_model)
    p = positions(1, 2 * SEQ)
    cut = SEQ
    later = x.clone()
    later[:, cut:] += torch.randn_like(later[:, cut:])
    with torch.no_grad():
        base, moved = mixer(x, _context(model, p, p)), mixer(later, _context(model, p, p))
    early = (moved[:, :cut] - base[:, :cut]).abs().max().item()
    if early > CHANGED:
        fail(
            f"changing the inputs from position {cut} on changed the outputs before it (by "
            f"{early:.3g}): a mixer is causal, token t sees tokens 0..t only"
        )
    if not (moved[:, cut:] - base[:, cut:]).abs().max().item() > CHANGED:
        fail(f"changing the inputs from position {cut} on left the outputs there unchanged")


@check("recurrent", ("mixer",), defaults_only=True, needs=model_buildable)
def recurrent(target: Target, variant: str, settings: Settings) -> None:
    """Decoding token by token from a fresh state, and a prefill followed by chunks and single
    tokens, give the outputs of one parallel forward (float64, atol 1e-8); the state after a
    prefill equals the state after the same tokens one by one; unless it declares 'nocache'."""
    if "nocache" in target.features:
        return  # declared: generation refuses it before starting
    from lmcore.model.cache import LayerCache

    model = _model(target, torch.float64)
    mixer = model.layers[0].attn
    name = f"{target.label} in {model_around(target, 0, num_layers=1)!r}"
    total = sum(PREFILL_STEPS)
    context = model.spec.context_length
    x = torch.randn(BATCH, total, model.spec.d_model, dtype=torch.float64)
    p = positions(1, total)
    atol, rtol = RECURRENT_TOL
    with torch.no_grad():
        full = mixer(x, _context(model, p, p))
        one = _state_of(mixer, name, BATCH, context, torch.float64)
        steps = []
        for t in range(total):
            view = LayerCache(one, t)
            steps.append(mixer(x[:, t : t + 1], _context(model, p[:, t : t + 1], p[:, : t + 1], view)))
        problem = mismatch(torch.cat(steps, dim=1), full, atol, rtol)
        if problem:
            fail(
                f"decoding one token at a time from a fresh state does not give the outputs of "
                f"one forward over the {total} tokens: {problem}. Its recurrent form (a cached "
                "step) and its parallel form must compute the same thing"
            )
        chunked = _state_of(mixer, name, BATCH, context, torch.float64)
        start = 0
        for n in PREFILL_STEPS:
            view = LayerCache(chunked, start)
            got = mixer(
                x[:, start : start + n],
                _context(model, p[:, start : start + n], p[:, : start + n], view),
            )
            problem = mismatch(got, full[:, start : start + n], atol, rtol)
            if problem:
                fail(
                    f"with a decoding state, {n} token(s) after {start} fed already do not give "
                    f"the outputs of one forward: {problem}. A cached forward of several "
                    "tokens continues from the state it is given (cache.start > 0) and leaves "
                    "the state after them"
                )
            if start == 0:  # the state after the prefill, against the prefix one by one
                prefix = _state_of(mixer, name, BATCH, context, torch.float64)
                for t in range(n):
                    mixer(
                        x[:, t : t + 1],
                        _context(model, p[:, t : t + 1], p[:, : t + 1], LayerCache(prefix, t)),
                    )
                _same_state(chunked, prefix, n, atol, rtol)
            start += n
        _same_state(chunked, one, total, atol, rtol)


def _same_state(a: DecodingState, b: DecodingState, n: int, atol: float, rtol: float) -> None:
    ta, tb = a.tensors(), b.tensors()
    if ta.keys() != tb.keys():
        fail(f"two decoding states of the same mixer hold different tensors: {sorted(ta)} and {sorted(tb)}")
    for key in ta:
        problem = mismatch(ta[key], tb[key], atol, rtol)
        if problem:
            fail(
                f"after {n} tokens fed as one prefill, the state's {key!r} differs from the "
                f"state after the same tokens one at a time: {problem}"
            )


@check("state", ("mixer",), declaration="state", needs=model_buildable)
def state(target: Target, variant: str, settings: Settings) -> None:
    """The declared decoding state, `(per_token, per_sequence)` bytes, is what
    `decoding_state` allocates for one sequence, at two context lengths, in float32 and
    bfloat16 (with a key and a value per token for each attention sub-layer, which lmcore
    counts)."""
    from lmcore.components import accepted_kwargs, count_state

    paths = attention_paths(target)
    for dtype in DTYPES.values():
        model = _model(target, torch.float32)
        mixer = model.layers[0].attn
        spec = model.spec
        kwargs = {**target.kwargs(0), "dtype": dtype}
        declared = count_state(target.component, kwargs)
        if declared is None:
            return
        per_token, per_sequence = declared
        kv = 2 * spec.num_kv_heads * spec.head_dim * dtype.itemsize * len(paths)
        for context in (SEQ, 2 * SEQ):
            made = _state_of(mixer, target.label, 1, context, dtype)
            held = sum(t.nbytes for t in made.tensors().values())
            expected = (per_token + kv) * context + per_sequence
            if held != expected:
                assert target.component.state is not None
                shown = call("state", accepted_kwargs(target.component.state, kwargs))
                extra = f" plus {kv:,} bytes a token for its attention" if kv else ""
                fail(
                    f"declares {shown} = {declared}{extra}, i.e. {expected:,} bytes for one "
                    f"sequence of context {context} in {dtype}, but decoding_state allocates "
                    f"{held:,}; fix the state function of the Component (bytes per token of "
                    "context, bytes per sequence)"
                )
