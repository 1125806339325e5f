"""A model built from per-layer values: each layer from its own block, kernel and biases, and
counted as built."""

from __future__ import annotations

from lmcore import build_model
from lmcore.model.counting import account

BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=6, num_heads=4, d_ff=48"


def test_the_model_builds_each_layer_from_its_own_values() -> None:
    model = build_model(
        f"{BASE}, block[1]=sandwich, attn[2]=chunked(block_size=4), qkv_bias[3]=true"
    )
    assert (
        type(model.layers[1]).__name__ == "Sandwich" and type(model.layers[0]).__name__ == "PreNorm"
    )
    assert type(model.layers[2].attn.kernel).__name__ == "ChunkedAttention"
    assert model.layers[3].attn.q_proj.bias is not None and model.layers[4].attn.q_proj.bias is None
    acc = account(model.blueprint)
    assert acc.params == sum(p.numel() for p in model.parameters())
    names = [r.name for r in acc.rows]
    assert "layers[1].ln1_out" in names and "layers[2].attn.kernel" in names
    assert "layers[0,4:].attn.q_proj" in names  # the layers like layer 0
