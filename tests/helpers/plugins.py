"""Fake plugin modules and the shared assertions of the built-in plugins' tests."""

from __future__ import annotations

import textwrap
from typing import Any

import torch

from lmcore import Component

# ---------------------------------------------------------------------------------------------
# Plugins: modules of fake distributions (installed with the `make_dist` fixture)
# ---------------------------------------------------------------------------------------------

# A third-party norm: the same maths as RMSNorm, so a model built with it is a real model.
OTHER_RMSNORM = """
from lmcore import Component, hookimpl
from lmcore_rmsnorm import RMSNorm

class OtherRMSNorm(RMSNorm):
    pass

@hookimpl
def lmcore_components():
    return [Component(kind="norm", name="rmsnorm", build=OtherRMSNorm, params=lambda d_model: d_model)]
"""

# A plugin module whose import fails.
BROKEN_IMPORT = "raise ImportError('flash kernels need triton')\n"


def plugin_source(body: str) -> str:
    """A plugin module: `body` (dedented) after the imports a declaration needs."""
    header = "from torch.nn import Module\nfrom lmcore import Arg, Component, Preset, hookimpl\n"
    return header + textwrap.dedent(body)


def scale_norm() -> Component:
    """A norm component declared in-process (no distribution): an identity, "scale"."""
    return Component(
        kind="norm", name="scale", build=lambda d_model: torch.nn.Identity(), help="test-only"
    )


def plain_kernel(features: frozenset[str], **declared: Any) -> Component:
    """lmcore's sdpa module declared as attn 'plain' with only `features` (and what `declared`
    adds): what it does not declare, lmcore works around or refuses."""
    from lmcore_sdpa import SDPA

    return Component(kind="attn", name="plain", build=SDPA, features=features, **declared)


# ---------------------------------------------------------------------------------------------
# Built-in plugins: a component's declarations against its module, and in a model
# ---------------------------------------------------------------------------------------------

# d_model, d_ff, num_heads, num_kv_heads, context_length, seq_len, kv_len
COUNT_SHAPES = [
    (64, 128, 4, 4, 16, 16, 16),
    (48, 200, 6, 2, 32, 5, 11),
]


def _dims(shape: tuple[int, ...]) -> dict[str, int]:
    d_model, d_ff, heads, kv_heads, ctx, _, _ = shape
    return {
        "d_model": d_model,
        "d_ff": d_ff,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": d_model // heads,
        "context_length": ctx,
    }


def _forward(kind: str, module: torch.nn.Module, shape: tuple[int, ...]) -> Any:
    """One forward of `module` for one sequence of `seq_len` queries over `kv_len` keys."""
    d_model, _, heads, kv_heads, _, seq, kv = shape
    x = torch.randn(1, seq, d_model)
    if kind in ("norm", "ffn"):
        return module(x)
    if kind == "pos":
        positions = torch.arange(seq)[None]
        return module.embed(x, positions), module.attention_bias(positions, positions)
    hd = d_model // heads
    q, k, v = (
        torch.randn(1, heads, seq, hd),
        torch.randn(1, kv_heads, kv, hd),
        torch.randn(1, kv_heads, kv, hd),
    )
    return module(q, k, v, causal=True)


def assert_declared_counts(
    kind: str, name: str, args: dict[str, Any], shape: tuple[int, ...]
) -> None:
    """The registered component's declared parameters and FLOPs equal its built module's."""
    from torch.utils.flop_counter import FlopCounterMode

    from lmcore import get_registry

    comp = get_registry().get(kind, name).component
    dims = {**_dims(shape), **args}
    module = comp.create(**dims)
    assert comp.count_params(**dims) == sum(p.numel() for p in module.parameters())
    with FlopCounterMode(display=False) as counter:
        _forward(kind, module, shape)
    seq, kv = shape[5], shape[6]
    assert comp.count_flops(**dims, seq_len=seq, kv_len=kv) == counter.get_total_flops()


def assert_compile_traces_the_whole_module(kind: str, name: str, args: dict[str, Any]) -> None:
    """The component has help, declares 'compile', and traces with fullgraph to the eager output."""
    from lmcore import get_registry

    comp = get_registry().get(kind, name).component
    assert comp.help
    assert "compile" in comp.features
    shape = COUNT_SHAPES[1]
    dims = {**_dims(shape), **args}
    module = comp.create(**dims)
    torch.manual_seed(0)
    eager = _forward(kind, module, shape)
    torch._dynamo.reset()
    if kind == "pos":
        module.embed = torch.compile(module.embed, fullgraph=True, backend="aot_eager")
        module.attention_bias = torch.compile(
            module.attention_bias, fullgraph=True, backend="aot_eager"
        )
        compiled = module
    else:
        compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.manual_seed(0)
    torch.testing.assert_close(_forward(kind, compiled, shape), eager)


def assert_model_runs_counts_and_is_causal(spec: str) -> None:
    """A model of `spec` counts its declared parameters, gives finite logits and stays causal."""
    from lmcore import build_model, get_registry

    torch.manual_seed(0)
    model = build_model(spec)
    reg = get_registry()
    declared = 0
    for kind in ("norm", "ffn", "pos", "attn"):
        c = model.spec.component(kind)
        count = reg.get(kind, c.name).component.count_params(**model.spec.dims(kind), **c.kwargs)
        declared += count * {
            "norm": 2 * model.spec.num_layers + 1,
            "ffn": model.spec.num_layers,
        }.get(kind, 1)
    modules = {"norm": ("ln1", "ln2", "ln_final"), "ffn": (".ffn.",), "pos": ("pos.",)}
    actual = sum(
        p.numel()
        for n, p in model.named_parameters()
        if any(m in n for ms in modules.values() for m in ms)
    )
    assert declared == actual
    ids = torch.randint(0, 10000, (3, 16))
    base = model(ids)
    assert base.shape == (3, 16, 10000) and torch.isfinite(base).all()
    for t in (0, 5, 14):
        changed = ids.clone()
        changed[:, t + 1 :] = torch.randint(0, 10000, changed[:, t + 1 :].shape)
        out = model(changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


def assert_logits_depend_on_positions(spec: str) -> None:
    """Shifting every position changes the logits (an absolute encoding is in use)."""
    from lmcore import build_model

    torch.manual_seed(0)
    model = build_model(spec)
    ids = torch.randint(0, 10000, (1, 8))
    a = model(ids, torch.arange(8)[None])
    b = model(ids, torch.arange(8)[None] + 5)
    assert not torch.allclose(a, b, atol=1e-3)
