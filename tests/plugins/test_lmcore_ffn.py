"""The feed-forward rows (swiglu, geglu, silu, gelu, relu): formulas, keys, default widths, dtypes, in a model."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lmcore import build_model, get_registry, parse_spec
from lmcore.model.nn import gated_d_ff
from lmcore_ffn import GEGLU, GELUFeedForward, ReLUFeedForward, SiLUFeedForward, SwiGLU
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_model_runs_counts_and_is_causal,
)


def test_swiglu_matches_the_formula() -> None:
    torch.manual_seed(0)
    ffn = SwiGLU(d_model=16, d_ff=48)
    x = torch.randn(2, 3, 16)
    w1, w2, w3 = ffn.w1.weight, ffn.w2.weight, ffn.w3.weight
    expected = (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T
    torch.testing.assert_close(ffn(x), expected)


def test_weight_shapes_and_keys_are_cs336s() -> None:
    ffn = SwiGLU(d_model=64, d_ff=128)
    shapes = {k: tuple(v.shape) for k, v in ffn.state_dict().items()}
    assert shapes == {"w1.weight": (128, 64), "w2.weight": (64, 128), "w3.weight": (128, 64)}


def test_declared_default_width_is_the_gated_rule() -> None:
    declared = get_registry().get("ffn", "swiglu").component.default_d_ff
    assert declared is not None
    assert [declared(d) for d in (16, 512, 768, 1600)] == [
        gated_d_ff(d) for d in (16, 512, 768, 1600)
    ]


UNGATED = {
    "silu": (SiLUFeedForward, F.silu),
    "gelu": (GELUFeedForward, F.gelu),  # F.gelu's default is the exact erf form
    "relu": (ReLUFeedForward, F.relu),
}


@pytest.mark.parametrize("name", UNGATED)
def test_ungated_ffn_matches_torch(name: str) -> None:
    cls, act = UNGATED[name]
    torch.manual_seed(0)
    ffn = cls(d_model=16, d_ff=40)
    x = torch.randn(2, 3, 16)
    expected = act(x @ ffn.w1.weight.T) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)


@pytest.mark.parametrize("name", UNGATED)
def test_ungated_keys_and_shapes_follow_swiglu(name: str) -> None:
    ffn = UNGATED[name][0](d_model=64, d_ff=256)
    shapes = {k: tuple(v.shape) for k, v in ffn.state_dict().items()}
    assert shapes == {"w1.weight": (256, 64), "w2.weight": (64, 256)}


def test_geglu_matches_the_formula() -> None:
    torch.manual_seed(0)
    ffn = GEGLU(d_model=16, d_ff=48)
    x = torch.randn(2, 3, 16)
    w1, w2, w3 = ffn.w1.weight, ffn.w2.weight, ffn.w3.weight
    expected = (F.gelu(x @ w1.T) * (x @ w3.T)) @ w2.T
    torch.testing.assert_close(ffn(x), expected)
    shapes = {k: tuple(v.shape) for k, v in ffn.state_dict().items()}
    assert shapes == {"w1.weight": (48, 16), "w2.weight": (16, 48), "w3.weight": (48, 16)}


def test_default_widths() -> None:
    reg = get_registry()
    for name in ("silu", "gelu", "relu"):
        # Ungated rows declare no width; lmcore's own default, 4·d_model, applies.
        assert reg.get("ffn", name).component.default_d_ff is None
        assert parse_spec(f"tinystories, ffn={name}").d_ff == 2048
        assert parse_spec(f"gpt2-small, ffn={name}").d_ff == 3072  # gpt2's d_ff belongs to swiglu
    geglu, swiglu = (reg.get("ffn", n).component.default_d_ff for n in ("geglu", "swiglu"))
    assert geglu is not None and swiglu is not None
    for d in (16, 64, 512, 768, 1600):
        assert geglu(d) == swiglu(d)
    assert geglu(512) == 1344


@pytest.mark.parametrize("name", ["silu", "gelu", "relu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtype_is_kept(name: str, dtype: torch.dtype) -> None:
    ffn = get_registry().get("ffn", name).component.create(d_model=32, d_ff=64, dtype=dtype)
    out = ffn(torch.randn(2, 32, dtype=dtype))
    assert out.dtype == dtype and all(p.dtype == dtype for p in ffn.parameters())


def test_tinystories_silu_is_parameter_matched_with_swiglu() -> None:
    swiglu = build_model("tinystories", device="meta")
    silu = build_model("tinystories, ffn=silu", device="meta")
    # The preset's d_ff=1344 belongs to its swiglu; silu takes its own default 4·512.
    assert swiglu.spec.d_ff == 1344 and silu.spec.d_ff == 2048

    def ffn_params(m: torch.nn.Module) -> int:
        return sum(p.numel() for n, p in m.named_parameters() if ".ffn." in n)

    assert ffn_params(swiglu) == 4 * 3 * 512 * 1344 == 8_257_536
    assert ffn_params(silu) == 4 * 2 * 512 * 2048 == 8_388_608
    total_swiglu = sum(p.numel() for p in swiglu.parameters())
    total_silu = sum(p.numel() for p in silu.parameters())
    assert (total_swiglu, total_silu) == (22_696_448, 22_827_520)
    assert math.isclose(ffn_params(silu), ffn_params(swiglu), rel_tol=0.02)  # 1.6% apart
    assert math.isclose(total_silu, total_swiglu, rel_tol=0.01)  # 0.6% apart


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
@pytest.mark.parametrize(
    "name,args",
    [("silu", {}), ("gelu", {}), ("relu", {}), ("geglu", {})],
    ids=["ffn=silu", "ffn=gelu", "ffn=relu", "ffn=geglu"],
)
def test_declared_params_and_flops_equal_the_module(
    name: str, args: dict[str, Any], shape: tuple[int, ...]
) -> None:
    assert_declared_counts("ffn", name, args, shape)


@pytest.mark.parametrize(
    "name,args",
    [("silu", {}), ("gelu", {}), ("relu", {}), ("geglu", {})],
    ids=["ffn=silu", "ffn=gelu", "ffn=relu", "ffn=geglu"],
)
def test_features_are_declared_and_compile_traces_the_whole_module(
    name: str, args: dict[str, Any]
) -> None:
    assert_compile_traces_the_whole_module("ffn", name, args)


@pytest.mark.parametrize(
    "spec",
    [
        "cs336-tiny, ffn=silu",
        "cs336-tiny, ffn=gelu",
        "cs336-tiny, ffn=relu",
        "cs336-tiny, ffn=geglu",
    ],
)
def test_model_runs_counts_its_parameters_and_is_causal(spec: str) -> None:
    assert_model_runs_counts_and_is_causal(spec)


def test_flops_are_the_matmul_counts_written_out() -> None:
    reg = get_registry()

    def flops(name: str, **kwargs: int) -> int:
        return reg.get("ffn", name).component.count_flops(**kwargs)

    matmul = 2 * 10 * 64 * 256  # one (10 × 64) @ (64 × 256) product
    assert flops("silu", d_model=64, d_ff=256, seq_len=10) == 2 * matmul
    assert flops("relu", d_model=64, d_ff=256, seq_len=10) == 2 * matmul
    assert flops("geglu", d_model=64, d_ff=256, seq_len=10) == 3 * matmul
