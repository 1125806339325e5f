"""Rotary frequencies (`lmcore.model.rotary`) against the formulas written out here in float64
and against transformers' own `ROPE_INIT_FUNCTIONS`; the tables a model builds from them:
tests/plugins/test_lmcore_rope_options.py."""

from __future__ import annotations

import math

import pytest
import torch

from lmcore.model.rotary import inverse_frequencies, yarn_attention_factor, yarn_mscale

LLAMA31 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def llama3_reference(theta: float, dim: int, factor: float, low: float, high: float,
                     original: int) -> list[float]:  # fmt: skip
    """Llama 3.1's frequency scaling, one frequency at a time in float64 (Meta's reference
    `apply_scaling`, which `modeling_rope_utils._compute_llama3_parameters` vectorises)."""
    out = []
    for k in range(0, dim, 2):
        freq = 1.0 / theta ** (k / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(freq)
        elif wavelen > original / low:
            out.append(freq / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


@pytest.mark.parametrize(("theta", "dim", "original"), [(500000.0, 64, 8192), (10000.0, 32, 64)])
def test_llama3_scaling_is_the_reference_formula(theta: float, dim: int, original: int) -> None:
    got = inverse_frequencies(
        theta, dim, scaling="llama3", original_context_length=original, **LLAMA31
    )
    want = torch.tensor(llama3_reference(theta, dim, 8.0, 1.0, 4.0, original), dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)
    # the three regimes all occur in the second case: kept, divided, blended
    ratio = want / torch.tensor([1.0 / theta ** (k / dim) for k in range(0, dim, 2)])
    if original == 64:
        assert (
            ratio[0] == 1
            and ratio[-1] == pytest.approx(1 / 8)
            and ((ratio < 1) & (ratio > 1 / 8)).any()
        )


def test_linear_scaling_divides_every_frequency() -> None:
    plain = inverse_frequencies(10000.0, 16)
    torch.testing.assert_close(inverse_frequencies(10000.0, 16, scaling="linear", factor=4.0),
                               plain / 4.0, rtol=0, atol=0)  # fmt: skip
    want = torch.tensor([10000.0 ** (-k / 16) for k in range(0, 16, 2)], dtype=torch.float64)
    torch.testing.assert_close(plain.double(), want, rtol=1e-6, atol=0)


def yarn_reference(theta: float, dim: int, factor: float, original: int, fast: float,
                   slow: float, truncate: bool) -> list[float]:  # fmt: skip
    """YaRN's frequencies (Peng et al. 2023, eq. 17-19) one at a time in float64: dimension d
    turns original / (2π theta^(d/dim)) times; it keeps its frequency above beta_fast turns and is
    interpolated (divided by factor) below beta_slow, blended linearly in between."""

    def dim_at(turns: float) -> float:
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_at(fast), dim_at(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    out = []
    for i, k in enumerate(range(0, dim, 2)):
        freq = 1.0 / theta ** (k / dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(freq / factor * ramp + freq * (1 - ramp))
    return out


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_is_the_reference_formula_and_transformers_own(truncate: bool) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    got = inverse_frequencies(150000.0, 64, scaling="yarn", factor=32.0,
                              original_context_length=4096, truncate=truncate)  # fmt: skip
    want = yarn_reference(150000.0, 64, 32.0, 4096, 32.0, 1.0, truncate)
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64),
                               rtol=1e-5, atol=0)  # fmt: skip
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0,
                                          "factor": 32.0, "truncate": truncate,
                                          "original_max_position_embeddings": 4096})  # fmt: skip
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    assert torch.equal(got, hf_inv)
    assert yarn_attention_factor(32.0) == hf_factor == 0.1 * math.log(32.0) + 1


def test_yarns_attention_factor_given_or_from_mscale() -> None:
    assert yarn_mscale(0.5, 3.0) == 1.0  # no stretch, no factor
    assert yarn_attention_factor(40.0, attention_factor=1.25) == 1.25
    ratio = (0.1 * 1.0 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
    assert yarn_attention_factor(40.0, mscale=1.0, mscale_all_dim=0.707) == pytest.approx(ratio)
    assert yarn_attention_factor(40.0, mscale=1.0) == yarn_mscale(40.0)  # both, or neither
