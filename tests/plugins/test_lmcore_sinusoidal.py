"""pos=sinusoidal: Vaswani et al.'s fixed table added to the token embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from lmcore import SpecError, get_registry, parse_spec
from lmcore_sinusoidal import SinusoidalPositionalEncoding
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import (
    COUNT_SHAPES,
    assert_compile_traces_the_whole_module,
    assert_declared_counts,
    assert_logits_depend_on_positions,
    assert_model_runs_counts_and_is_causal,
)


def _sinusoid_table(length: int, d: int, base: float) -> torch.Tensor:
    """Vaswani et al. §3.5 written out element by element."""
    table = torch.empty(length, d, dtype=torch.float64)
    for p in range(length):
        for i in range(d // 2):
            angle = p / base ** (2 * i / d)
            table[p, 2 * i] = math.sin(angle)
            table[p, 2 * i + 1] = math.cos(angle)
    return table


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_sinusoidal_table_is_vaswanis(base: float) -> None:
    enc = SinusoidalPositionalEncoding(d_model=12, context_length=20, base=base)
    expected = _sinusoid_table(20, 12, base)
    torch.testing.assert_close(enc.table.double(), expected, atol=2e-6, rtol=0)


def test_sinusoidal_embed_adds_the_rows_at_the_given_positions() -> None:
    torch.manual_seed(0)
    enc = SinusoidalPositionalEncoding(d_model=8, context_length=16)
    x = torch.randn(2, 3, 8)
    positions = torch.tensor([[0, 1, 2], [7, 9, 15]])
    expected = x.double() + _sinusoid_table(16, 8, 10000.0)[positions]
    torch.testing.assert_close(enc.embed(x, positions).double(), expected, atol=1e-6, rtol=0)
    # (1, T) positions broadcast over the batch, as the model passes them.
    out = enc.embed(x, torch.tensor([[4, 5, 6]]))
    torch.testing.assert_close(out[1], x[1] + enc.table[4:7])


def test_sinusoidal_table_is_a_non_persistent_buffer_and_dtype_follows_x() -> None:
    enc = SinusoidalPositionalEncoding(d_model=8, context_length=16)
    assert enc.state_dict() == {} and [n for n, _ in enc.named_buffers()] == ["table"]
    x = torch.randn(1, 4, 8).to(torch.bfloat16)
    assert enc.embed(x, torch.arange(4)[None]).dtype == torch.bfloat16


def test_sinusoidal_refuses_an_odd_d_model() -> None:
    with raises_naming(
        SpecError,
        "pos 'sinusoidal'",
        "sinusoidal encodings fill (sin, cos) pairs",
        "d_model=63 is odd",
        "use an even d_model, or pos=learned",
    ):
        parse_spec("cs336-tiny, d_model=63, num_heads=3, pos=sinusoidal")
    with pytest.raises(ValueError, match=r"d_model=7 is odd"):
        SinusoidalPositionalEncoding(d_model=7, context_length=4)


# Declared accounting equals the built module, at two shapes; torch.compile traces it whole.
@pytest.mark.parametrize("shape", COUNT_SHAPES)
def test_declared_params_and_flops_equal_the_module(shape: tuple[int, ...]) -> None:
    assert_declared_counts("pos", "sinusoidal", {"base": 10000.0}, shape)


def test_features_are_declared_and_compile_traces_the_whole_module() -> None:
    assert_compile_traces_the_whole_module("pos", "sinusoidal", {"base": 10000.0})


def test_model_runs_counts_its_parameters_and_is_causal() -> None:
    assert_model_runs_counts_and_is_causal("cs336-tiny, pos=sinusoidal")


def test_declared_features() -> None:
    assert get_registry().get("pos", "sinusoidal").component.features == {"absolute", "compile"}


def test_absolute_encodings_make_logits_depend_on_positions() -> None:
    assert_logits_depend_on_positions("cs336-tiny, pos=sinusoidal")
