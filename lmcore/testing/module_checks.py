"""What every component is as a torch module: it builds at two shapes into a module of its kind's
protocol (`build`), keeps its input's shape and dtype with finite outputs (`forward`), passes
gradients to every parameter and input (`gradients`), round-trips its state dict (`state_dict`),
allocates nothing on meta (`meta`) and declares the role of every parameter (`roles`).

Each check builds the component at the kit's small test shapes, runs it on seeded random inputs
and raises `ConformanceError` with a sentence naming what broke and how to fix it.
"""

from __future__ import annotations

import io
import itertools

import torch
from torch import Tensor, nn

from lmcore.components import KINDS
from lmcore.errors import PluginError
from lmcore.interfaces import PROTOCOLS, LayerContext
from lmcore.model.roles import roles_of
from lmcore.testing.core import (
    ATTN_LENGTHS,
    BATCH,
    DTYPES,
    SHAPES,
    SHORT,
    TOKENWISE,
    Settings,
    Target,
    check,
    describe,
    fail,
    first_line,
    hooks,
    make_inputs,
    mismatch,
    output_names,
    run,
    shape_of,
)

POS_METHODS = ("embed", "rotation", "attention_bias")


@check("build", KINDS)
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


@check("forward", KINDS, variants=("float32", "bfloat16"))
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
    elif target.kind == "mixer":
        i = make_inputs(target, dtype)  # x (B, T, d_model), positions
        out = module(i["x"], LayerContext(positions=i["positions"]))
        _expect(out, i["x"].shape, dtype, "the output")
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


def _not_empty(target: Target) -> str | None:
    empty = target.kind == "ffn" and "empty" in target.features
    return "it declares 'empty': no sub-layer, its output depends on nothing" if empty else None


@check("gradients", KINDS, needs=_not_empty)
def gradients(target: Target, variant: str, settings: Settings) -> None:
    """Gradients reach every parameter and every input the outputs depend on."""
    module = target.build()
    inputs = make_inputs(target)
    for t in inputs.values():
        if t.is_floating_point():
            t.requires_grad_()
    outs = run(target.kind, module, inputs)
    _backward(outs)
    used = ["x"] if target.kind in (*TOKENWISE, "block", "mixer") else ["q", "k", "v"]
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


@check("state_dict", KINDS)
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
        fail(f"load_state_dict(strict=True) into a second instance failed: {first_line(e)}")
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


@check("meta", KINDS)
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


@check("roles", KINDS)
def roles(target: Target, variant: str, settings: Settings) -> None:
    """Every parameter has exactly one declared role (`parameter_roles()`, lmcore.model.roles)
    that fits its shape, a packed tensor's splits adding up to its rows, at both shapes."""
    for shape in range(len(SHAPES)):
        module = target.build(shape, device="meta")
        try:
            roles_of(module)
        except PluginError as e:
            fail(f"{e}; the optimizer, weight decay and learning-rate multipliers go by roles")


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
