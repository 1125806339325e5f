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


def test_a_qwen3_next_shaped_hybrid_shows_each_kind_of_layers_decoding_state() -> None:
    """Qwen3-Next's 3:1 layout at its real widths, counted before anything is built: the gated
    DeltaNet layers' state is the same at any context, the attention layers' grows."""
    from lmcore.cli.describe import describe_lines

    spec = (
        "vocab_size=151936, context_length=262144, d_model=2048, num_layers=48, num_heads=16, "
        "num_kv_heads=2, head_dim=256, d_ff=5120, attn_gate=true, "
        "mixer=gated_deltanet(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128), "
        "mixer[3::4]=attention"
    )
    text = "\n".join(describe_lines(describe(spec)))
    # per DeltaNet layer, float32: the (32, 128, 128) matrix and 3 inputs of 2·16·128 + 32·128
    deltanet = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 4
    kv = 2 * 2 * 256 * 4  # keys and values of 2 heads of 256, per token
    assert deltanet == 2_195_456 and kv == 4096
    assert re.search(r"^  layers all but 3::4 \(36\), mixer=gated_deltanet +- +2\.09 MiB +75\.38 MiB$",
                     text, re.M), text  # fmt: skip
    assert re.search(r"^  layers 3::4 \(12\), mixer=attention +4\.00 KiB/token +- +12\.00 GiB$",
                     text, re.M), text  # fmt: skip
    total = 36 * deltanet + 12 * kv * 262144
    assert f"{total / 2**30:.2f} GiB per sequence" in text and "12.07 GiB" in text
    assert re.search(r"^layers\[all but 3::4\]\.attn +mixer=gated_deltanet +36 ", text, re.M)
    assert re.search(r"^layers\[3::4\]\.attn\.gate_proj +linear 2048->4096 +12 ", text, re.M)
