"""A component's declarations against what its module does: the parameter count and buffer bytes
(`params`), the FLOPs of a forward (`flops`) and the activation bytes autograd keeps
(`activations`), at two shapes, so that `lmcore describe` can account for a model before any
weight exists.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lmcore.components import KINDS, accepted_kwargs, count
from lmcore.interfaces import LayerContext
from lmcore.testing.core import (
    BATCH,
    DTYPES,
    SEQ,
    SHAPES,
    SHORT,
    Settings,
    Target,
    call,
    check,
    fail,
    first_line,
    make_inputs,
    model_around,
    own_named,
    run,
)


@check("params", KINDS)
def params(target: Target, variant: str, settings: Settings) -> None:
    """The declared parameter count equals the built module's, at two shapes; so do the declared
    buffer bytes, when the component declares them, in float32 and bfloat16, and the declared
    module objects."""
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
        _modules(target, shape, module)


def _own_parameters(target: Target, module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The module's parameters; for a block, those outside the parts it is given (its attn, ffn
    and the norms its `norms` declaration names), which lmcore accounts for on their own."""
    return own_named(target, list(module.named_parameters()))


def _buffers(target: Target, shape: int) -> None:
    """Declared buffer bytes equal the built module's, in float32 and bfloat16."""
    declaration = target.component.buffers
    if declaration is None:
        return
    kwargs = target.kwargs(shape)
    for dtype in DTYPES.values():
        built = target.build(shape, dtype=dtype)
        held = own_named(target, list(built.named_buffers()))
        sizes = {n: b.numel() * b.element_size() for n, b in held}
        stated = target.component.count_buffers(**kwargs, dtype=dtype)
        if stated != sum(sizes.values()):
            shown = call("buffers", accepted_kwargs(declaration, {**kwargs, "dtype": dtype}))
            fail(
                f"declares {shown} = {stated:,} bytes, but the module built in {dtype} holds "
                f"{sum(sizes.values()):,} bytes of buffers ({sizes or 'none'}); fix the "
                "buffers function of the Component (bytes: numel × element size)"
            )


def _modules(target: Target, shape: int, module: nn.Module) -> None:
    """Declared module objects equal the built module's (itself and every submodule; for a block,
    those outside its parts)."""
    declaration = target.component.modules
    if declaration is None:
        return
    kwargs = target.kwargs(shape)
    stated = count(target.component, "modules", kwargs)
    named = own_named(target, list(module.named_modules()))
    if stated != len(named):
        shown = call("modules", accepted_kwargs(declaration, kwargs))
        fail(
            f"declares {shown} = {stated:,}, but the built module is {len(named):,} module "
            "objects (itself and its submodules); fix the modules function of the Component"
        )


@check("flops", KINDS)
def flops(target: Target, variant: str, settings: Settings) -> None:
    """Declared FLOPs equal torch's FlopCounterMode count of one sequence's forward, at several
    lengths and two shapes."""
    lengths = [(SEQ, SEQ), (2 * SEQ, 2 * SEQ)]
    if target.kind == "attn":
        lengths.append((SHORT, 2 * SEQ))
    if target.kind in ("block", "mixer"):
        return _layer_flops(target, lengths)
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


def _layer_flops(target: Target, lengths: list[tuple[int, int]]) -> None:
    """A block's forward does the FLOPs lmcore accounts for one layer, its parts' and its own; a
    mixer's those of its attention sub-layers and its own."""
    from lmcore.blueprint import resolve
    from lmcore.model.counting import account

    for shape, (seq, _) in itertools.product(range(len(SHAPES)), lengths):
        bp = resolve(model_around(target, shape, num_layers=1), target.registry)
        module = target.build(shape)
        x = torch.randn(1, seq, SHAPES[shape]["d_model"])
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            module(x, LayerContext(positions=torch.arange(seq)[None]))
        measured = counter.get_total_flops()
        within = "layers.*" if target.kind == "block" else "layers.*.attn"
        rows = [r for r in account(bp, seq_len=seq).rows if r.name.startswith(within)]
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


@check("activations", KINDS, declaration="activations")
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
                f"{type(e).__name__}: {first_line(e)}"
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
