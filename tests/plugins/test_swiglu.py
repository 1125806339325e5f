from __future__ import annotations

import torch
import torch.nn.functional as F
from lmcore_swiglu import SwiGLU, default_d_ff


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


def test_default_d_ff_is_8_thirds_d_model_rounded_to_64() -> None:
    assert default_d_ff(512) == 1344  # 1365.3 -> 21 * 64
    assert default_d_ff(768) == 2048
    assert default_d_ff(1600) == 4288  # 4266.7 -> 67 * 64
    assert default_d_ff(16) == 64  # never below one block of 64
    for d in range(64, 4097, 64):
        assert default_d_ff(d) % 64 == 0
        assert abs(default_d_ff(d) - 8 * d / 3) <= 32
