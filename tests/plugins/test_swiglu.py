from __future__ import annotations

import torch
import torch.nn.functional as F

from lmcore import get_registry
from lmcore.model.nn import gated_d_ff
from lmcore_ffn import SwiGLU


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
