"""Unit tests of the normalised residual and its wiring; the contract tests come from
`--lmcore-conformance` (see addopts in pyproject.toml)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lmcore
from lmcore.interfaces import LayerContext
from lmcore_ngpt import NormalizedBlock


def test_forward_is_the_normalised_residual_update() -> None:
    model = lmcore.build_model("cs336-tiny, block=ngpt(alpha_init=0.3)")
    block = model.layers[0]
    assert isinstance(block, NormalizedBlock)
    x = torch.randn(2, 5, 64)
    context = LayerContext(model.pos.rotation(torch.arange(5)[None]))
    with torch.no_grad():
        h = F.normalize(x + 0.3 * (F.normalize(block.attn(x, context), dim=-1) - x), dim=-1)
        expected = F.normalize(h + 0.3 * (F.normalize(block.ffn(h), dim=-1) - h), dim=-1)
        got = block(x, context)
    torch.testing.assert_close(got, expected)
    assert torch.allclose(got.norm(dim=-1), torch.ones(2, 5))  # the stream is on the sphere


def test_it_holds_two_alphas_and_no_norms_of_the_models_kind() -> None:
    model = lmcore.build_model("cs336-tiny, block=ngpt")
    keys = {k.removeprefix("layers.0.") for k in model.state_dict() if k.startswith("layers.0.")}
    assert {k for k in keys if not k.startswith(("attn.", "ffn."))} == {"alpha_attn", "alpha_ffn"}
    default = sum(p.numel() for p in lmcore.build_model("cs336-tiny").parameters())
    # 3 layers: two 64-wide alphas each, instead of two 64-wide RMSNorm gains.
    assert sum(p.numel() for p in model.parameters()) == default


def test_the_spec_is_canonical_and_checked() -> None:
    assert "block=ngpt(alpha_init=0.05)" in str(lmcore.parse_spec("cs336-tiny, block=ngpt"))
    with pytest.raises(lmcore.SpecError, match=r"alpha_init.*must be > 0.0, got 0.0"):
        lmcore.parse_spec("cs336-tiny, block=ngpt(alpha_init=0)")


def test_a_model_with_it_saves_and_loads_bitwise(tmp_path) -> None:
    torch.manual_seed(0)
    model = lmcore.build_model("cs336-tiny, block=ngpt")
    path = model.save(tmp_path / "m.safetensors")
    loaded = lmcore.load(path)
    ids = torch.randint(0, 10_000, (2, 16))
    assert torch.equal(loaded(ids), model(ids))
    assert lmcore.read_info(path).components["block"].dist == "lmcore-ngpt"
