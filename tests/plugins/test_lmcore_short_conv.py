"""plugins/lmcore_short_conv.py: LFM2's gated short convolution against its formula written out
per token and against transformers' own Lfm2ShortConv with the same weights; its decoding
state, padding, and its refusal of a convolution too short to mix."""

from __future__ import annotations

import pytest
import torch

from lmcore import build_model
from lmcore.errors import SpecError
from lmcore.interfaces import LayerContext
from lmcore.model.cache import LayerCache, RecurrentState

SPEC = "vocab_size=50, context_length=16, d_model=8, num_layers=1, num_heads=2, mixer=short_conv"


def mixer(args: str = "", dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(SPEC + (f"({args})" if args else ""), dtype=dtype)
    return model.layers[0].attn


def per_token(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """y_t = out_proj(c_t · (b_conv + Σ_j w_j · (b ⊙ h)_{t-K+1+j})), zeros before the start."""
    W_in, W_out = m.in_proj.weight, m.out_proj.weight
    K = m.conv_size
    proj = x @ W_in.T + (m.in_proj.bias if m.in_proj.bias is not None else 0)
    b, c, h = proj[..., :8], proj[..., 8:16], proj[..., 16:]
    gated = b * h
    out = torch.zeros_like(x)
    for t in range(x.shape[1]):
        acc = torch.zeros_like(x[:, 0])
        for j in range(K):
            s = t - K + 1 + j
            if s >= 0:
                acc = acc + m.conv_weight[:, j] * gated[:, s]
        if m.conv_bias is not None:
            acc = acc + m.conv_bias
        out[:, t] = (c[:, t] * acc) @ W_out.T + (m.out_proj.bias if m.out_proj.bias is not None else 0)
    return out


@pytest.mark.parametrize("args", ["", "bias=true", "conv_size=4"])
def test_it_computes_its_formula_token_by_token(args: str) -> None:
    m = mixer(args)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x, LayerContext()), per_token(m, x), rtol=1e-12, atol=1e-12)


def test_it_matches_transformers_lfm2_short_conv() -> None:
    lfm2 = pytest.importorskip("transformers.models.lfm2.modeling_lfm2", reason="transformers")
    from transformers import Lfm2Config

    m = mixer("bias=true", dtype=torch.float32)
    config = Lfm2Config(hidden_size=8, conv_bias=True, conv_L_cache=3, num_hidden_layers=1,
                        layer_types=["conv"], num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    ref = lfm2.Lfm2ShortConv(config, layer_idx=0).eval()
    with torch.no_grad():
        ref.in_proj.weight.copy_(m.in_proj.weight)
        ref.in_proj.bias.copy_(m.in_proj.bias)
        ref.conv.weight.copy_(m.conv_weight[:, None, :])
        ref.conv.bias.copy_(m.conv_bias)
        ref.out_proj.weight.copy_(m.out_proj.weight)
        ref.out_proj.bias.copy_(m.out_proj.bias)
        x = torch.randn(2, 9, 8)
        torch.testing.assert_close(m(x, LayerContext()), ref(x), rtol=1e-5, atol=1e-5)


def test_decoding_keeps_the_last_inputs_and_nothing_that_grows() -> None:
    m = mixer()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    state = m.decoding_state(batch=2, context_length=16, dtype=torch.float64)
    assert isinstance(state, RecurrentState) and not state.rewind
    assert {k: tuple(t.shape) for k, t in state.tensors().items()} == {"conv": (2, 8, 2)}
    with torch.no_grad():
        full = m(x, LayerContext())
        steps = [m(x[:, t : t + 1], LayerContext(cache=LayerCache(state, t))) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-12, atol=1e-12)
    proj = x @ m.in_proj.weight.T
    gated = proj[..., :8] * proj[..., 16:]
    torch.testing.assert_close(state["conv"], gated[:, -2:].transpose(1, 2))


def test_a_left_pad_leaves_the_state_as_a_fresh_sequence_has_it() -> None:
    m = mixer()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    padded = torch.cat([torch.randn(1, 2, 8, dtype=torch.float64), x], dim=1)
    valid = torch.tensor([[False, False, True, True, True, True, True]])
    alone = m.decoding_state(batch=1, context_length=16, dtype=torch.float64)
    beside = m.decoding_state(batch=1, context_length=16, dtype=torch.float64)
    with torch.no_grad():
        want = m(x, LayerContext(cache=LayerCache(alone, 0)))
        got = m(padded, LayerContext(cache=LayerCache(beside, 0, valid)))
    torch.testing.assert_close(got[:, 2:], want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(beside["conv"], alone["conv"], rtol=1e-12, atol=1e-12)


def test_a_convolution_of_one_tap_is_refused() -> None:
    with pytest.raises(SpecError, match=r"conv_size=1: a short convolution sees the token and at least"):
        build_model(SPEC + "(conv_size=1)", device="meta")
