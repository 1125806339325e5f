"""plugins/lmcore_presets.py: each built-in preset is the shape DESIGN.md gives it."""

from __future__ import annotations

import pytest

from lmcore import parse_spec

# name: (vocab_size, context_length, d_model, num_layers, num_heads, d_ff)
SHAPES = {
    "cs336-tiny": (10_000, 16, 64, 3, 4, 128),
    "tinystories": (10_000, 256, 512, 4, 16, 1344),
    "gpt2-small": (50_257, 1024, 768, 12, 12, 3072),
    "gpt2-medium": (50_257, 1024, 1024, 24, 16, 4096),
    "gpt2-large": (50_257, 1024, 1280, 36, 20, 5120),
    "gpt2-xl": (50_257, 1024, 1600, 48, 25, 6400),
}


@pytest.mark.parametrize("name", SHAPES)
def test_each_preset_has_its_shape_and_the_default_components(name: str) -> None:
    s = parse_spec(name)
    got = (s.vocab_size, s.context_length, s.d_model, s.num_layers, s.num_heads, s.d_ff)
    assert got == SHAPES[name]
    assert s.num_kv_heads == s.num_heads and not s.tie_embeddings
    assert (s.norm.name, s.ffn.name, s.pos.name, s.attn.name) == (
        "rmsnorm",
        "swiglu",
        "rope",
        "sdpa",
    )
    assert dict(s.pos.args)["theta"] == 10_000.0


def test_later_items_override_a_presets_values() -> None:
    s = parse_spec("gpt2-small, d_ff=1000, pos=nope")
    assert (s.d_model, s.d_ff, s.pos.name) == (768, 1000, "nope")
