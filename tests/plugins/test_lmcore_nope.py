"""plugins/lmcore_nope.py: NoPE adds, rotates and biases nothing, so attention sees no order
except the causal mask's."""

from __future__ import annotations

import torch

from lmcore import build_model

# One layer: in a second, the earlier positions' outputs (each its own causal view) carry order.
SPEC = "vocab_size=50, context_length=12, d_model=32, num_layers=1, num_heads=4, pos=nope"


def test_its_hooks_do_nothing() -> None:
    pos = build_model(SPEC).pos
    x = torch.randn(2, 5, 32)
    positions = torch.arange(5).expand(2, 5)
    assert pos.embed(x, positions) is x
    assert pos.rotation(positions) is None
    assert pos.attention_bias(positions, positions) is None


def test_the_last_token_sees_its_prefix_as_a_set() -> None:
    # Without positions, causal attention is a function of the set of earlier tokens: the last
    # position's logits do not change when the tokens before it are reordered.
    torch.manual_seed(0)
    model = build_model(SPEC).eval()
    ids = torch.tensor([[3, 17, 8, 41, 22, 9]])
    shuffled = torch.tensor([[22, 8, 41, 3, 17, 9]])
    with torch.no_grad():
        a, b = model(ids)[0, -1], model(shuffled)[0, -1]
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    rope = build_model(SPEC.replace("pos=nope", "pos=rope")).eval()
    with torch.no_grad():
        assert not torch.allclose(rope(ids)[0, -1], rope(shuffled)[0, -1], atol=1e-3)
