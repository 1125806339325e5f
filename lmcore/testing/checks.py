"""The conformance checks, one function per contract, registered with `core.check`.

Each check builds the component at the kit's small test shapes, runs it on seeded random inputs
and raises `ConformanceError` with a sentence naming what broke and how to fix it. The
attention kernels' own checks are in `lmcore.testing.attention_checks`.
"""

from __future__ import annotations

import io
import itertools
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from lmcore.components import KINDS, accepted_kwargs
from lmcore.interfaces import PROTOCOLS, LayerContext, PositionalEncoding

if TYPE_CHECKING:
    from lmcore.model.transformer import TransformerLM

from lmcore.testing.core import (
    BATCH,
    DTYPES,
    SEQ,
    SHAPES,
    SHORT,
    TOKENWISE,
    Settings,
    Target,
    call,
    check,
    describe,
    fail,
    hooks,
    make_inputs,
    mismatch,
    model_around,
    output_names,
    positions,
    run,
    shape_of,
    tolerance,
)

ALL = KINDS
# (Sq, Sk) pairs every attention check covers: a plain forward, and decoding with a KV cache.
ATTN_LENGTHS = ((SEQ, SEQ), (SHORT, SEQ))
# A perturbation changed an output when it moved by more than this (outputs are O(1)).
CHANGED = 1e-5
POS_METHODS = ("embed", "rotation", "attention_bias")


# ------------------------------------------------------------------------------ every kind


@check("build", ALL)
def build(target: Target, variant: str, settings: Settings) -> None:
    """The factory builds a torch.nn.Module implementing its kind's protocol, at two shapes."""
    for shape in range(len(SHAPES)):
        module = target.build(shape)
        protocol = PROTOCOLS[target.kind]
        if not isinstance(module, protocol):
            missing = [m for m in POS_METHODS if not callable(getattr(module, m, None))]
            fail(
                f"{type(module).__name__} does not implement lmcore.interfaces.{protocol.__name__}"
                f" (missing {', '.join(missing) or 'a method'}); subclass "
                "lmcore.interfaces.PositionalEncodingBase and override the hooks you need"
            )


@check("forward", ALL, variants=("float32", "bfloat16"))
def forward(target: Target, variant: str, settings: Settings) -> None:
    """Outputs keep the input's shape and dtype and are finite on random input."""
    dtype = DTYPES[variant]
    module = target.build(dtype=dtype)
    for name, p in module.named_parameters():
        if p.dtype != dtype:
            fail(
                f"built with dtype={dtype}, parameter {name!r} is {p.dtype}; pass dtype= to every "
                "parameter __init__ creates, e.g. nn.Parameter(torch.ones(d, dtype=dtype))"
            )
    if target.kind in TOKENWISE:
        x = make_inputs(target, dtype, lead=(3,))["x"]  # (B, 3, T, d_model)
        _expect(module(x), x.shape, dtype, "the output")
    elif target.kind == "block":
        x = make_inputs(target, dtype)["x"]  # (B, T, d_model)
        _expect(module(x, LayerContext()), x.shape, dtype, "the output")
    elif target.kind == "attn":
        for (sq, sk), causal in itertools.product(ATTN_LENGTHS, (False, True)):
            i = make_inputs(target, dtype, seq=sq, kv_seq=sk)
            out = module(i["q"], i["k"], i["v"], causal=causal)
            _expect(out, i["q"].shape, dtype, f"the output (causal={causal}, Sq={sq}, Sk={sk})")
    else:
        _pos_forward(target, module, dtype)


def _pos_forward(target: Target, module: nn.Module, dtype: torch.dtype) -> None:
    i = make_inputs(target, dtype)
    x, q, k, p = i["x"], i["q"], i["k"], i["positions"]
    pos = hooks(module)
    _expect(pos.embed(x, p), x.shape, dtype, "embed(x, positions)")
    _expect(pos.embed(x, p[:1]), x.shape, dtype, "embed(x, positions of shape (1, T))")
    rotate = pos.rotation(p)
    if rotate is not None:
        _expect(rotate(q), q.shape, dtype, "rotation(positions)(q)")
        _expect(rotate(k), k.shape, dtype, f"rotation(positions)(k) with {k.shape[1]} kv heads")
    heads = shape_of(target)["num_heads"]
    for q_pos in (p, p[:, -SHORT:]):
        bias = pos.attention_bias(q_pos, p)
        if bias is None:
            continue
        full = (BATCH, heads, q_pos.shape[1], p.shape[1])
        what = f"attention_bias for {q_pos.shape[1]} queries and {p.shape[1]} keys"
        if not isinstance(bias, Tensor) or not bias.is_floating_point():
            fail(f"{what} must be a floating-point tensor, got {bias!r:.80}")
        if not _broadcasts(tuple(bias.shape), full):
            fail(
                f"{what} has shape {tuple(bias.shape)}, which does not broadcast to "
                f"(B, H, Sq, Sk) = {full}; return (H, Sq, Sk) or (B, H, Sq, Sk)"
            )
        _finite(bias, what)


@check("gradients", ALL)
def gradients(target: Target, variant: str, settings: Settings) -> None:
    """Gradients reach every parameter and every input the outputs depend on."""
    module = target.build()
    inputs = make_inputs(target)
    for t in inputs.values():
        if t.is_floating_point():
            t.requires_grad_()
    outs = run(target.kind, module, inputs)
    _backward(outs)
    used = ["x"] if target.kind in (*TOKENWISE, "block") else ["q", "k", "v"]
    if target.kind == "pos":
        rotates = hooks(module).rotation(inputs["positions"]) is not None
        used = ["x", "q", "k"] if rotates else ["x"]
    for name in used:
        g = inputs[name].grad
        if g is None or not bool(g.ne(0).any()):
            fail(
                f"no gradient reaches the input {name!r}: the output is detached from it "
                "(.detach(), .data, torch.no_grad() or a non-differentiable op in the forward)"
            )
        if not bool(torch.isfinite(g).all()):
            fail(f"the gradient reaching the input {name!r} has NaN or inf values on random input")
    zero = _check_param_grads(module)
    if zero:
        # An all-zero gradient can be an artefact of the initial values (a zero-initialised
        # gate); nudge every parameter and look again before calling it a bug.
        with torch.no_grad():
            for p in module.parameters():
                if p.is_floating_point():
                    p.add_(0.1 * torch.randn_like(p))
        module.zero_grad()
        _backward(run(target.kind, module, inputs))
        zero = _check_param_grads(module)
        if zero:
            fail(
                f"parameter {zero[0]!r} gets an all-zero gradient, even after every parameter "
                "was moved off its initial value; it does not influence the output"
            )


def _check_param_grads(module: nn.Module) -> list[str]:
    """Fail on a parameter without a gradient; return the ones whose gradient is all zeros."""
    zero = []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            fail(
                f"parameter {name!r} gets no gradient: the forward does not use it, or uses it "
                "detached (.detach(), .data, torch.no_grad()); use it or remove it"
            )
        if not bool(torch.isfinite(p.grad).all()):
            fail(f"the gradient of parameter {name!r} has NaN or inf values on random input")
        if not bool(p.grad.ne(0).any()):
            zero.append(name)
    return zero


@check("state_dict", ALL)
def state_dict(target: Target, variant: str, settings: Settings) -> None:
    """A saved state dict, loaded (strict) into another instance, reproduces the outputs exactly."""
    torch.manual_seed(settings.seed + 1)
    saved = target.build()
    torch.manual_seed(settings.seed + 2)
    fresh = target.build()
    with torch.no_grad():  # the fresh instance must take every value from the state dict
        for p in fresh.parameters():
            if p.is_floating_point():
                p.add_(torch.randn_like(p))
    buffer = io.BytesIO()
    torch.save(saved.state_dict(), buffer)
    buffer.seek(0)
    try:
        loaded = torch.load(buffer, weights_only=True)
    except Exception as e:
        fail(f"state_dict() holds more than tensors: torch.load(weights_only=True) raised {e}")
    try:
        fresh.load_state_dict(loaded, strict=True)
    except RuntimeError as e:
        fail(f"load_state_dict(strict=True) into a second instance failed: {_first_line(e)}")
    inputs = make_inputs(target)
    with torch.no_grad():
        before, after = run(target.kind, saved, inputs), run(target.kind, fresh, inputs)
    names = output_names(target.kind, saved, inputs)
    for name, a, b in zip(names, before, after, strict=True):
        problem = mismatch(b, a, atol=0.0, rtol=0.0, equal_nan=True)
        if problem:
            fail(
                f"after a state-dict round trip, {name} differs ({problem}): the output depends "
                "on state the state dict does not hold; register it with nn.Parameter or "
                "register_buffer (persistent=False only for what __init__ recomputes)"
            )


@check("meta", ALL)
def meta(target: Target, variant: str, settings: Settings) -> None:
    """Built with device="meta" it allocates nothing: every parameter and buffer is on meta."""
    module = target.build(device="meta")
    tensors = itertools.chain(
        (("parameter", n, t) for n, t in module.named_parameters()),
        (("buffer", n, t) for n, t in module.named_buffers()),
    )
    for what, name, t in tensors:
        if t.device.type != "meta":
            fail(
                f"built with device='meta', {what} {name!r} is on {t.device}; pass device= to "
                "every tensor __init__ creates (torch.empty(..., device=device)) so that "
                "build_model(spec, device='meta') allocates nothing"
            )


@check("params", ALL)
def params(target: Target, variant: str, settings: Settings) -> None:
    """The declared parameter count equals the built module's, at two shapes; so do the declared
    buffer bytes, when the component declares them, in float32 and bfloat16."""
    for shape in range(len(SHAPES)):
        kwargs = target.kwargs(shape)
        declared = target.component.count_params(**kwargs)
        module = target.build(shape)
        own = _own_parameters(target, module)
        actual = sum(p.numel() for _, p in own)
        if declared != actual:
            found = ", ".join(f"{n} {tuple(p.shape)}" for n, p in own)
            shown = call("params", accepted_kwargs(target.component.params, kwargs))
            fail(
                f"declares {shown} = {declared:,}, but the built module has {actual:,} "
                f"parameters ({found or 'none'}); fix the params function of the Component"
            )
        _buffers(target, shape)


def _own_parameters(target: Target, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The module's parameters; for a block, those outside the parts it is given (its attn, ffn
    and the norms its `norms` declaration names), which lmcore accounts for on their own."""
    named = list(module.named_parameters())
    if target.kind != "block":
        return named
    parts = ("attn", "ffn", *_norm_names(target))
    return [(n, p) for n, p in named if n.split(".", 1)[0] not in parts]


def _norm_names(target: Target) -> tuple[str, ...]:
    names = target.component.norms
    return tuple(accepted_call(names, target.arg_values())) if names is not None else ()


def accepted_call(fn: Any, available: Mapping[str, Any]) -> Any:
    return fn(**accepted_kwargs(fn, available))


def _buffers(target: Target, shape: int) -> None:
    """Declared buffer bytes equal the built module's, in float32 and bfloat16."""
    declaration = target.component.buffers
    if declaration is None:
        return
    kwargs = target.kwargs(shape)
    for dtype in DTYPES.values():
        built = target.build(shape, dtype=dtype)
        held = built.named_buffers()
        if target.kind == "block":
            parts = ("attn", "ffn", *_norm_names(target))
            held = ((n, b) for n, b in built.named_buffers() if n.split(".", 1)[0] not in parts)
        sizes = {n: b.numel() * b.element_size() for n, b in held}
        stated = target.component.count_buffers(**kwargs, dtype=dtype)
        if stated != sum(sizes.values()):
            shown = call("buffers", accepted_kwargs(declaration, {**kwargs, "dtype": dtype}))
            fail(
                f"declares {shown} = {stated:,} bytes, but the module built in {dtype} holds "
                f"{sum(sizes.values()):,} bytes of buffers ({sizes or 'none'}); fix the "
                "buffers function of the Component (bytes: numel × element size)"
            )


@check("flops", ALL)
def flops(target: Target, variant: str, settings: Settings) -> None:
    """Declared FLOPs equal torch's FlopCounterMode count of one sequence's forward, at several
    lengths and two shapes."""
    lengths = [(SEQ, SEQ), (2 * SEQ, 2 * SEQ)]
    if target.kind == "attn":
        lengths.append((SHORT, 2 * SEQ))
    if target.kind == "block":
        return _block_flops(target, lengths)
    for shape, (seq, kv) in itertools.product(range(len(SHAPES)), lengths):
        module = target.build(shape)
        inputs = make_inputs(target, shape=shape, batch=1, seq=seq, kv_seq=kv)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            run(target.kind, module, inputs)
        measured = counter.get_total_flops()
        kwargs = {**target.kwargs(shape), "seq_len": seq, "kv_len": kv}
        declared = target.component.count_flops(**kwargs)
        if declared != measured:
            shown = call("flops", accepted_kwargs(target.component.flops, kwargs))
            fail(
                f"declares {shown} = {declared:,}, but one forward of a single sequence does "
                f"{measured:,} matmul FLOPs (torch.utils.flop_counter.FlopCounterMode); fix the "
                "flops function of the Component (2·m·n·p per (m×n)·(n×p) matmul)"
            )


def _block_flops(target: Target, lengths: list[tuple[int, int]]) -> None:
    """A block's forward does the FLOPs lmcore accounts for one layer: its parts' and its own."""
    from lmcore.blueprint import resolve
    from lmcore.model.counting import account

    for shape, (seq, _) in itertools.product(range(len(SHAPES)), lengths):
        bp = resolve(model_around(target, shape, num_layers=1), target.registry)
        module = target.build(shape)
        x = torch.randn(1, seq, SHAPES[shape]["d_model"])
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            module(x, LayerContext())
        measured = counter.get_total_flops()
        rows = [r for r in account(bp, seq_len=seq).rows if r.per_layer]
        expected = sum(r.flops_each for r in rows)
        if measured != expected:
            own = sum(r.flops_each for r in rows if r.entry == target.entry)
            kwargs = {**target.kwargs(shape), "seq_len": seq, "kv_len": seq}
            shown = call("flops", accepted_kwargs(target.component.flops, kwargs))
            fail(
                f"one forward of a single sequence of {seq} tokens does {measured:,} matmul "
                f"FLOPs (torch.utils.flop_counter.FlopCounterMode), but its parts account for "
                f"{expected - own:,} and it declares {shown} = {own:,} of its own; fix the "
                "flops function of the Component (2·m·n·p per matmul it does itself)"
            )


@check("activations", ALL, declaration="activations")
def activations(target: Target, variant: str, settings: Settings) -> None:
    """Declared activations equal the bytes autograd keeps for the component in a small model's
    forward + loss (measured on the meta device), at two shapes (the second with grouped-query
    heads), in float32 and bfloat16, for one sequence and for several."""
    from lmcore.blueprint import resolve
    from lmcore.describe import measure_activations
    from lmcore.errors import LmcoreError
    from lmcore.model.counting import account, activation_kwargs
    from lmcore.model.transformer import build_model

    cases = ((1, SEQ), (BATCH, SEQ - 1))  # an odd length too: block sizes rarely divide it
    for shape, dtype, (batch, seq) in itertools.product(range(len(SHAPES)), DTYPES.values(), cases):
        spec = model_around(target, shape)
        try:
            bp = resolve(spec, target.registry)
            acc = account(bp, batch=batch, seq_len=seq, dtype=dtype)
            model = build_model(bp, device="meta", dtype=dtype)
            measured = measure_activations(acc, model)
        except (LmcoreError, RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            fail(
                f"cannot measure its activations in the model {spec!r} on the meta device: "
                f"{type(e).__name__}: {_first_line(e)}"
            )
        for row in acc.rows:
            if row.entry != target.entry or row.activations_each is None:
                continue
            got = measured[row.name] // row.count
            if got * row.count == measured[row.name] and got == row.activations_each:
                continue
            shape_kw = {"batch": batch, "seq_len": seq, "kv_len": seq, "dtype": dtype}
            kwargs = (
                {**dict(row.kwargs), **shape_kw}
                if row.kwargs
                else activation_kwargs(bp, row.entry.kind, batch=batch, seq_len=seq, dtype=dtype)
            )
            declaration = target.component.activations
            assert declaration is not None  # rows without one were skipped above
            shown = call("activations", accepted_kwargs(declaration, kwargs))
            fail(
                f"declares {shown} = {row.activations_each:,} bytes, but in the model {spec!r} "
                f"autograd keeps {got:,} bytes for it ({row.name}, measured on the meta device "
                f"as lmcore describe --measure does); fix the activations function of the "
                "Component: count every distinct tensor its forward saves for backward"
            )
        declared = acc.activations
        total = sum(measured.values())
        if declared != total:  # the rows agree, so a storage is counted twice or not at all
            fail(
                f"its declaration matches its own row, but the model {spec!r} keeps {total:,} "
                f"bytes where the declarations add up to {declared:,}: the component's output "
                "is probably also saved by the next layer; do not count tensors it returns"
            )


_model_around = model_around


@check("compile", ALL, feature="compile", defaults_only=True)
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
            f"torch.compile(backend={backend!r}) failed: {type(e).__name__}: {_first_line(e)}; "
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


def _model_buildable(target: Target) -> str | None:
    """Why no model can be built around `target` in its registry: a default component of
    another slot is missing (a registry holding only the plugin under test)."""
    from lmcore.registry import get_registry
    from lmcore.spec import SLOTS

    registry = target.registry or get_registry()
    missing = [
        f"{kind} {name!r}"
        for kind, name in SLOTS.items()
        if kind != target.kind and name not in registry.names(kind)
    ]
    if not missing:
        return None
    return (
        f"the check builds a model around {target.label}, but the registry lacks the default "
        f"{', '.join(missing)} for the other slots (lmcore's built-ins are not loaded)"
    )


@check("cache", ALL, defaults_only=True, needs=_model_buildable)
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
            fail(f"cannot build the model {spec!r}: {type(e).__name__}: {_first_line(e)}")
        total = sum(CACHE_STEPS)
        ids = torch.randint(0, 97, (BATCH, total))
        padded = "mask" in model.blueprint.features("attn")
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
                "their positions do not count"
            )


# ------------------------------------------------------------------------------ norm and ffn


@check("per_token", TOKENWISE)
def per_token(target: Target, variant: str, settings: Settings) -> None:
    """Each (..., d_model) vector is mapped on its own: no mixing across tokens or batch rows."""
    module = target.build()
    x = make_inputs(target, lead=(3,))["x"]  # (B, 3, T, d_model)
    token = (1, 2, SEQ - 3)
    nudged = x.clone()
    nudged[token] += torch.randn(x.shape[-1])
    with torch.no_grad():
        changed = (module(nudged) - module(x)).abs().amax(dim=-1) > CHANGED
    changed[token] = False
    if bool(changed.any()):
        other = tuple(int(i) for i in changed.nonzero()[0])
        fail(
            f"changing the input vector at index {token} changed the output at {other}: a "
            f"{target.kind} maps each (..., d_model) vector on its own; reduce over the last "
            "dimension only (dim=-1, keepdim=True)"
        )


# ------------------------------------------------------------------------------ blocks


def _block_buildable(target: Target) -> str | None:
    """Why a block cannot be checked: it is built with the registry's default parts."""
    return _model_buildable(target)


@check("keys", ("block",), needs=_block_buildable)
def keys(target: Target, variant: str, settings: Settings) -> None:
    """The state dict holds `attn.*`, `ffn.*`, one set of norm keys per name its `norms`
    declaration gives, and its own parameters: the parts it is given, each once, where the
    declaration says."""
    module = target.build()
    names = _norm_names(target)
    state = module.state_dict()
    tops = {key.split(".", 1)[0] for key in state}
    for part in ("attn", "ffn"):
        if part not in tops:
            fail(
                f"its state dict has no {part}.* keys (it has {sorted(tops)}); keep the "
                f"{part} it is given as the attribute `{part}`"
            )
    missing = [
        n for n in names if n not in tops and any(True for _ in _norm(module, n).parameters())
    ]
    if missing:
        fail(
            f"its norms declaration names {list(names)}, but the state dict has no keys under "
            f"{missing}; keep each norm built with norm() as the attribute of that name"
        )
    parts = {id(m) for n in ("attn", "ffn", *names) for m in _norm(module, n).modules()}
    stray = [
        n
        for n, child in module.named_children()
        if n not in ("attn", "ffn", *names) and any(id(m) in parts for m in child.modules())
    ]
    if stray:
        fail(
            f"it holds its parts a second time, as {stray}: each of attn, ffn and the norms "
            "appears once in the state dict"
        )


def _norm(module: nn.Module, name: str) -> nn.Module:
    found = getattr(module, name, None)
    if not isinstance(found, nn.Module):
        fail(f"it has no submodule {name!r}, which its norms declaration names")
    return found


class _Zero(nn.Module):
    """A sub-layer that gives zeros (of its input's shape, through the input for autograd)."""

    def forward(self, x: Tensor, *rest: Any) -> Tensor:
        return x * 0


@check("residual", ("block",), needs=_block_buildable)
def residual(target: Target, variant: str, settings: Settings) -> None:
    """Tokens mix only through attention, causally: the output at a position does not change
    when a later position's input does, and changes with its own. With the 'residual' feature,
    the block returns its input exactly when attn and ffn give zeros."""
    module = target.build()
    x = make_inputs(target)["x"]  # (B, T, d_model)
    cut = SEQ // 2
    later = x.clone()
    later[:, cut:] += torch.randn_like(later[:, cut:])
    with torch.no_grad():
        base, moved = module(x, LayerContext()), module(later, LayerContext())
    early = (moved[:, :cut] - base[:, :cut]).abs().max().item()
    if early > CHANGED:
        fail(
            f"changing the inputs from position {cut} on changed the output before it (by "
            f"{early:.3g}): a block mixes tokens only through its attention sub-layer, "
            "which is causal"
        )
    if not (moved[:, cut:] - base[:, cut:]).abs().max().item() > CHANGED:
        fail(f"changing the inputs from position {cut} on left the output there unchanged")
    if "residual" not in target.features:
        return
    module.attn, module.ffn = _Zero(), _Zero()
    with torch.no_grad():
        out = module(x, LayerContext())
    problem = mismatch(out, x, atol=0.0, rtol=0.0)
    if problem:
        fail(
            f"declares 'residual', but with attn and ffn giving zeros the output is not its "
            f"input: {problem}; the residual stream must pass through the block unchanged, or "
            "drop 'residual' from the Component's features"
        )


# ------------------------------------------------------------------------------ positions


@check("features", ("pos",))
def features(target: Target, variant: str, settings: Settings) -> None:
    """The declared features match what the hooks do: 'rotary' ⇔ rotation, 'bias' ⇔
    attention_bias, 'absolute' ⇔ embed changes x."""
    pos = hooks(target.build())
    i = make_inputs(target)
    x, p = i["x"], i["positions"]
    with torch.no_grad():
        does = {
            "rotary": ("rotation(positions) returns a function", pos.rotation(p) is not None),
            "bias": ("attention_bias returns a tensor", pos.attention_bias(p, p) is not None),
            "absolute": ("embed(x, positions) changes x", not torch.equal(pos.embed(x, p), x)),
        }
    for feature, (hook, happens) in does.items():
        if feature in target.features and not happens:
            fail(
                f"declares {feature!r}, but it is not true that {hook}; implement the hook or "
                f"drop {feature!r} from the Component's features"
            )
        if happens and feature not in target.features:
            fail(
                f"{hook}, but the Component does not declare {feature!r}; add it to features, "
                "so that specs can check what the encoding needs (an attention bias needs an "
                "attn kernel with 'bias')"
            )


@check("relative", ("pos",), feature="relative")
def relative(target: Target, variant: str, settings: Settings) -> None:
    """Relative: shifting every position by a constant changes no q·k score after rotation, no
    attention bias and no embedding."""
    pos = hooks(target.build())
    s = shape_of(target)
    heads, d = s["num_heads"], s["head_dim"]
    p = positions(BATCH, SEQ)
    shifted = p + torch.tensor([[3], [11]])  # a different shift per row, within the context
    q, k = torch.randn(BATCH, heads, SEQ, d), torch.randn(BATCH, heads, SEQ, d)
    x = torch.randn(BATCH, SEQ, s["d_model"])
    atol, rtol = 1e-4, 1e-4  # float32 rotation tables at positions up to ~30
    with torch.no_grad():
        for what, a, b in _relative_pairs(pos, p, shifted, q, k, x):
            problem = mismatch(b, a, atol=atol, rtol=rtol)
            if problem:
                fail(
                    f"declares 'relative', but {what} changes when every position is shifted "
                    f"by a constant (3 in row 0, 11 in row 1): {problem}; it must depend only "
                    "on the offset between query and key positions, or drop 'relative'"
                )


def _relative_pairs(
    pos: PositionalEncoding, p: Tensor, shifted: Tensor, q: Tensor, k: Tensor, x: Tensor
) -> Iterator[tuple[str, Tensor, Tensor]]:
    """(what, at positions p, at shifted positions) for each hook the encoding implements."""
    yield "embed(x, positions)", pos.embed(x, p), pos.embed(x, shifted)
    rot, rot_shifted = pos.rotation(p), pos.rotation(shifted)
    if rot is not None and rot_shifted is not None:
        scores = rot(q) @ rot(k).transpose(-2, -1)
        scores_shifted = rot_shifted(q) @ rot_shifted(k).transpose(-2, -1)
        yield "q·k after rotation(positions)", scores, scores_shifted
    for q_pos, q_shifted in ((p, shifted), (p[:, -SHORT:], shifted[:, -SHORT:])):
        b, b_shifted = pos.attention_bias(q_pos, p), pos.attention_bias(q_shifted, shifted)
        if b is not None and b_shifted is not None:
            yield f"attention_bias ({q_pos.shape[1]} queries)", b, b_shifted


# ------------------------------------------------------------------------------ helpers


def _expect(out: object, shape: torch.Size, dtype: torch.dtype, what: str) -> None:
    if not isinstance(out, Tensor):
        fail(f"{what} is a {type(out).__name__}, not a torch.Tensor")
    if out.shape != shape:
        fail(f"{what} has shape {tuple(out.shape)}; it must keep the input's {tuple(shape)}")
    if out.dtype != dtype:
        name = str(dtype).removeprefix("torch.")
        fail(
            f"{what} is {describe(out)} for {name} input; return the input's dtype (compute "
            "in float32 if you need to, then cast back with .to(x.dtype))"
        )
    _finite(out, what)


def _broadcasts(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcasts to exactly `full`."""
    if len(shape) > len(full):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(full), strict=False))


def _finite(t: Tensor, what: str) -> None:
    bad = ~torch.isfinite(t.detach())
    if bool(bad.any()):
        where = tuple(int(i) for i in bad.nonzero()[0])
        fail(f"{what} has {int(bad.sum())} NaN/inf values on random normal input, first at {where}")


def _backward(outs: list[Tensor]) -> None:
    """Backpropagate a random cotangent: every output element gets a non-zero weight."""
    loss = sum(
        ((o.float() * torch.randn(o.shape)).sum() for o in outs if o.requires_grad),
        start=torch.zeros(()),
    )
    if loss.requires_grad:
        torch.autograd.backward(loss)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
