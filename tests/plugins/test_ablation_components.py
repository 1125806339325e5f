"""Every component of issue 6: declared accounting equals the built module, torch.compile traces
it whole, and a model with it in its slot runs and stays causal."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lmcore import build_model, get_registry

# (kind, name, spec arguments)
NEW: list[tuple[str, str, dict[str, Any]]] = [
    ("norm", "layernorm", {"bias": True, "eps": 1e-5}),
    ("norm", "layernorm", {"bias": False, "eps": 1e-5}),
    ("norm", "none", {}),
    ("pos", "learned", {}),
    ("pos", "sinusoidal", {"base": 10000.0}),
    ("pos", "alibi", {}),
    ("ffn", "silu", {}),
    ("ffn", "gelu", {}),
    ("ffn", "relu", {}),
    ("ffn", "geglu", {}),
    ("attn", "chunked", {"block_size": 3}),
]
IDS = [
    f"{kind}={name}" + ("" if args.get("bias", True) else "(bias=false)")
    for kind, name, args in NEW
]
SHAPES = [  # d_model, d_ff, num_heads, num_kv_heads, context_length, seq_len, kv_len
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


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,name,args", NEW, ids=IDS)
def test_declared_params_and_flops_equal_the_module(kind, name, args, shape) -> None:
    comp = get_registry().get(kind, name).component
    dims = {**_dims(shape), **args}
    module = comp.create(**dims)
    assert comp.count_params(**dims) == sum(p.numel() for p in module.parameters())
    with FlopCounterMode(display=False) as counter:
        _forward(kind, module, shape)
    seq, kv = shape[5], shape[6]
    assert comp.count_flops(**dims, seq_len=seq, kv_len=kv) == counter.get_total_flops()


def test_flops_are_the_matmul_counts_written_out() -> None:
    reg = get_registry()

    def flops(kind: str, name: str, **kwargs: int) -> int:
        return reg.get(kind, name).component.count_flops(**kwargs)

    matmul = 2 * 10 * 64 * 256  # one (10 × 64) @ (64 × 256) product
    assert flops("ffn", "silu", d_model=64, d_ff=256, seq_len=10) == 2 * matmul
    assert flops("ffn", "relu", d_model=64, d_ff=256, seq_len=10) == 2 * matmul
    assert flops("ffn", "geglu", d_model=64, d_ff=256, seq_len=10) == 3 * matmul
    # q kᵀ and p v for each of 8 heads, 5 queries over 20 keys, D=64: block size changes nothing.
    for block in (1, 4, 128):
        assert flops(
            "attn", "chunked", num_heads=8, head_dim=64, seq_len=5, kv_len=20, block_size=block
        ) == 8 * 2 * (2 * 5 * 64 * 20)


@pytest.mark.parametrize("kind,name,args", NEW, ids=IDS)
def test_features_are_declared_and_compile_traces_the_whole_module(kind, name, args) -> None:
    comp = get_registry().get(kind, name).component
    assert comp.help
    assert "compile" in comp.features
    shape = SHAPES[1]
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


def test_declared_features() -> None:
    reg = get_registry()
    features = {(k, n): reg.get(k, n).component.features for k, n, _ in NEW}
    assert features["pos", "alibi"] == {"bias", "relative", "compile"}
    assert features["pos", "learned"] == features["pos", "sinusoidal"] == {"absolute", "compile"}
    assert features["attn", "chunked"] == {
        "gqa", "bias", "mask", "scale", "softcap", "window", "compile"
    }  # fmt: skip


@pytest.mark.parametrize(
    "spec",
    [
        "cs336-tiny, norm=layernorm",
        "cs336-tiny, norm=layernorm(bias=false)",
        "cs336-tiny, norm=none",
        "cs336-tiny, norm=none, block=postnorm",
        "cs336-tiny, pos=learned",
        "cs336-tiny, pos=sinusoidal",
        "cs336-tiny, pos=alibi",
        "cs336-tiny, ffn=silu",
        "cs336-tiny, ffn=gelu",
        "cs336-tiny, ffn=relu",
        "cs336-tiny, ffn=geglu",
        "cs336-tiny, attn=chunked(block_size=4)",
        "cs336-tiny, attn=chunked(block_size=5), pos=alibi, num_kv_heads=1",
    ],
)
def test_model_runs_counts_its_parameters_and_is_causal(spec: str) -> None:
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
