"""pos=alibi: the paper's slopes, a bias of minus slope times distance, relative positions only."""

from __future__ import annotations

import pytest
import torch

import lmcore
from lmcore import Component, SpecError, build_model, get_registry, parse_spec
from lmcore_alibi import ALiBi, alibi_slopes
from lmcore_sdpa import SDPA
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_model_runs_counts_and_is_causal,
)


@pytest.mark.parametrize(
    "heads,expected",
    [
        (8, [2**-1, 2**-2, 2**-3, 2**-4, 2**-5, 2**-6, 2**-7, 2**-8]),
        (4, [2**-2, 2**-4, 2**-6, 2**-8]),
        (1, [2**-8]),
        # Not a power of two: the 4-head slopes, then every other one of the 8-head slopes.
        (6, [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]),
        # 12 heads: the 8-head slopes, then 16-head slopes 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
        (12, [*(2.0**-k for k in range(1, 9)), 2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]),
    ],
)
def test_slopes_follow_the_paper(heads: int, expected: list[float]) -> None:
    assert alibi_slopes(heads) == pytest.approx(expected, rel=1e-12)


def test_bias_is_minus_slope_times_distance_written_out() -> None:
    alibi = ALiBi(num_heads=4)
    slopes = alibi_slopes(4)
    qp = torch.tensor([[3, 4, 5], [0, 1, 2]])  # (B, Sq)
    kp = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]])  # (B, Sk)
    bias = alibi.attention_bias(qp, kp)
    assert bias.shape == (2, 4, 3, 6)
    for b in range(2):
        for h in range(4):
            for i in range(3):
                for j in range(6):
                    want = -slopes[h] * (qp[b, i].item() - kp[b, j].item())
                    assert bias[b, h, i, j].item() == pytest.approx(want, abs=1e-7)


def test_default_positions_give_a_bias_shared_by_the_batch() -> None:
    bias = ALiBi(num_heads=2).attention_bias(torch.arange(4)[None], torch.arange(4)[None])
    assert bias.shape == (1, 2, 4, 4)
    # Two heads: slopes 2^-4 and 2^-8. Query 3 looks back 3, 2, 1, 0 tokens.
    torch.testing.assert_close(bias[0, 0, 3], torch.tensor([-3.0, -2.0, -1.0, 0.0]) / 16)
    torch.testing.assert_close(bias[0, 1, 3], torch.tensor([-3.0, -2.0, -1.0, 0.0]) / 256)


def test_no_parameters_and_bias_dtype_follows_the_model() -> None:
    alibi = ALiBi(num_heads=4)
    assert alibi.state_dict() == {} and [n for n, _ in alibi.named_buffers()] == ["slopes"]
    pos = torch.arange(3)[None]
    assert alibi.attention_bias(pos, pos).dtype == torch.float32
    assert ALiBi(num_heads=4, dtype=torch.bfloat16).attention_bias(pos, pos).dtype == torch.bfloat16
    assert alibi.to(torch.bfloat16).attention_bias(pos, pos).dtype == torch.bfloat16


def test_model_with_alibi_depends_only_on_relative_positions() -> None:
    torch.manual_seed(0)
    model = build_model("cs336-tiny, pos=alibi")
    ids = torch.randint(0, 10000, (2, 8))
    base = model(ids, torch.arange(8)[None])
    torch.testing.assert_close(model(ids, torch.arange(8)[None] + 7), base)
    # ... and differs from the same weights without positions.
    nope = build_model("cs336-tiny, pos=nope")
    nope.load_state_dict(model.state_dict(), strict=True)
    assert not torch.allclose(nope(ids), base, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_model_runs_in_dtype(dtype: torch.dtype) -> None:
    model = build_model("cs336-tiny, pos=alibi", dtype=dtype)
    logits = model(torch.randint(0, 10000, (2, 16)))
    assert logits.dtype == dtype and torch.isfinite(logits).all()


def test_a_kernel_without_bias_refuses_alibi_before_allocation() -> None:
    with lmcore.scoped_registry() as reg:
        reg.add(
            Component(
                kind="attn",
                name="nobias",
                build=SDPA,
                help="a kernel that declares no additive bias",
                features=frozenset({"gqa", "mask"}),
            )
        )
        with raises_naming(
            SpecError,
            "attn 'nobias' cannot take the additive attention bias that pos 'alibi' produces",
            "kernels that can: chunked, sdpa",
        ):
            parse_spec("cs336-tiny, pos=alibi, attn=nobias")
        # The same kernel is fine with a positional encoding that adds no bias.
        assert parse_spec("cs336-tiny, pos=rope, attn=nobias").attn.name == "nobias"


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
def test_declared_params_and_flops_equal_the_module(shape: tuple[int, ...]) -> None:
    assert_declared_counts("pos", "alibi", {}, shape)


def test_features_are_declared_and_compile_traces_the_whole_module() -> None:
    assert_compile_traces_the_whole_module("pos", "alibi", {})


@pytest.mark.parametrize(
    "spec",
    ["cs336-tiny, pos=alibi", "cs336-tiny, attn=chunked(block_size=5), pos=alibi, num_kv_heads=1"],
)
def test_model_runs_counts_its_parameters_and_is_causal(spec: str) -> None:
    assert_model_runs_counts_and_is_causal(spec)


def test_declared_features() -> None:
    assert get_registry().get("pos", "alibi").component.features == {"bias", "relative", "compile"}
