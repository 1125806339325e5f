"""`describe` of a model whose layers differ: each kind of layer, its rows and its values."""

from __future__ import annotations

import re

from lmcore.describe import describe

BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=6, num_heads=4, d_ff=48"


def test_describe_shows_each_kind_of_layer() -> None:
    from lmcore.cli.describe import describe_lines

    found = describe(f"{BASE}, window[0::2]=4, ffn[5]=silu", measure=True)
    assert found.mismatches == ()
    text = "\n".join(describe_lines(found))
    assert re.search(r"^layers\[0::2\]\.attn\.kernel +attn=sdpa +3 ", text, re.M), text
    assert re.search(r"^layers\[5\]\.ffn +ffn=silu +1 ", text, re.M), text
    assert re.search(r"^layers\[1,3\] +2 +8,768 +311,296$", text, re.M), text
    assert "  layers 0::2 (3 layers): ffn=swiglu, window=4" in text
    assert "  layers 1,3 (2 layers): ffn=swiglu, window=0" in text
    assert "  layers 5 (1 layer): ffn=silu, window=0" in text
