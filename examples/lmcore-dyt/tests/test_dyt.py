"""Unit tests of DyT's maths and wiring; the contract tests come from `--lmcore-conformance`
(see addopts in pyproject.toml)."""

from __future__ import annotations

import math

import pytest
import torch

import lmcore
from lmcore_dyt import DyT, dyt_params


def test_forward_is_weight_tanh_alpha_x_plus_bias() -> None:
    norm = DyT(4, alpha_init=0.5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
        norm.bias.copy_(torch.tensor([0.0, 0.1, 0.2, 0.3]))
    x = torch.tensor([[0.0, 1.0, -2.0, 4.0]])
    expected = [
        1.0 * math.tanh(0.0) + 0.0,
        2.0 * math.tanh(0.5) + 0.1,
        -1.0 * math.tanh(-1.0) + 0.2,
        0.5 * math.tanh(2.0) + 0.3,
    ]
    torch.testing.assert_close(norm(x), torch.tensor([expected]))


def test_alpha_is_one_learnable_scalar_and_bias_is_optional() -> None:
    norm = DyT(8, alpha_init=0.8, bias=False)
    assert dict(norm.named_parameters()).keys() == {"alpha", "weight"}
    assert norm.alpha.shape == (1,) and norm.alpha.item() == pytest.approx(0.8)
    assert dyt_params(d_model=8, bias=False) == 9 and dyt_params(d_model=8, bias=True) == 17


def test_bfloat16_in_bfloat16_out_even_with_float32_weights() -> None:
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    assert DyT(8)(x).dtype == torch.bfloat16


def test_installed_plugin_is_found_through_its_entry_point() -> None:
    entry = lmcore.get_registry().get("norm", "dyt")
    assert entry.provenance.dist == "lmcore-dyt"
    assert entry.provenance.module == "lmcore_dyt"


def test_a_spec_builds_a_model_with_dyt_everywhere() -> None:
    model = lmcore.build_model("cs336-tiny, norm=dyt(alpha_init=1.0)")
    assert "norm=dyt(alpha_init=1.0,bias=true)" in str(model.spec)
    assert isinstance(model.ln_final, DyT) and isinstance(model.layers[0].ln1, DyT)
    logits = model(torch.randint(0, 10_000, (2, 16)))
    assert logits.shape == (2, 16, 10_000) and bool(torch.isfinite(logits).all())


def test_a_bad_argument_is_rejected_before_any_weight_exists() -> None:
    with pytest.raises(lmcore.SpecError, match=r"alpha_init.*must be > 0.0, got -1.0"):
        lmcore.parse_spec("cs336-tiny, norm=dyt(alpha_init=-1.0)")
