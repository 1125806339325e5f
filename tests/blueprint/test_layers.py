"""Per-layer values (`key[layers]=value`): the canonical form, round trips, errors with carets,
the checks before allocation, a preset's per-layer items; hypothesis property tests as for the
rest of the grammar."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lmcore
from lmcore import ComponentSpec, SpecError, build_model, parse_spec
from lmcore.spec import LayerValue, format_layers
from tests.helpers.errors import raises_naming

BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=6, num_heads=4, d_ff=48"


def base(layers: int) -> str:
    return BASE.replace("num_layers=6", f"num_layers={layers}")


def test_gemma2s_alternating_window_is_one_canonical_string() -> None:
    spec = parse_spec(f"{BASE}, window[0::2]=4")
    assert str(spec).endswith(",attn=sdpa,window[0::2]=4")
    assert spec.window == 0 and spec.layers == (LayerValue("window", (0, 2, 4), 4),)
    assert [spec.at(i).window for i in range(6)] == [4, 0, 4, 0, 4, 0]
    for same in (
        f"{BASE}, window[0,2,4]=4",
        f"{BASE}, window[-6, -4, -2]=4",
        f"{BASE}, window[::2]=4",
        f"{BASE}, window[0:5:2]=4",
        f"{BASE}, window=4, window[1::2]=0",  # the whole-model value is chosen canonically
        f"{BASE}, window[0]=4, window[2:6:2]=4",
    ):
        assert str(parse_spec(same)) == str(spec), same


def test_dense_layers_among_moe_ones_and_nope_every_fourth_layer() -> None:
    qwen = parse_spec(f"{BASE}, ffn[2:]=geglu")  # mlp_only_layers=[0, 1]
    assert str(qwen).split(",ffn=")[1].startswith("swiglu,ffn[2:]=geglu,")
    assert [qwen.at(i).ffn.name for i in range(6)] == ["swiglu"] * 2 + ["geglu"] * 4
    llama4 = parse_spec(f"{base(8)}, pos[3::4]=nope")
    assert "pos=rope(theta=10000.0),pos[3::4]=nope," in str(llama4)
    model = build_model(llama4)
    assert model.pos_index == [0, 0, 0, 1, 0, 0, 0, 1]
    assert type(model.layer_pos[0]).__name__ == "NoPE"


def test_the_whole_model_norm_is_also_ln_finals() -> None:
    spec = parse_spec(f"{BASE}, norm=layernorm, norm[0:]=rmsnorm")
    assert spec.norm.name == "layernorm" and all(
        spec.at(i).norm.name == "rmsnorm" for i in range(6)
    )
    model = build_model(spec)
    assert type(model.ln_final).__name__ == "LayerNorm"
    assert type(model.layers[3].ln1).__name__ == "RMSNorm"


def test_a_per_layer_ffn_width_belongs_to_d_ff() -> None:
    spec = parse_spec(f"{BASE}, ffn[1]=silu(d_ff=64)")
    assert spec.at(1).d_ff == 64 and spec.at(1).ffn == ComponentSpec("silu")
    assert "d_ff=48,d_ff[1]=64," in str(spec)
    with raises_naming(
        SpecError, "d_ff of layer 1 is given twice", "by d_ff[...] and as an argument of ffn[...]"
    ):
        parse_spec(f"{BASE}, d_ff[1]=32, ffn[1]=silu(d_ff=64)")


@pytest.mark.parametrize(
    ("tail", "facts", "caret"),
    [
        ("window[1, 1]=2", ("window[...] selects layer 1 twice", "name each layer once"), "^"),
        (
            "window[0]=2, window[0:2]=3",
            ("layer 0 gets window twice", re.compile(r"from window\[\.\.\.\] at position \d+ and here"),
             "keep one"),
            "^^^^^",
        ),
        ("windw[0]=2", ("unknown key 'windw'", "(did you mean 'window'?)"), "^^^^^"),
        (
            "vocab_size[0]=2",
            ("vocab_size is one value for the whole model",
             "the keys that may differ by layer are d_ff, block"),
            "^^^^^^^^^^",
        ),
        (
            "ffn[1]=swiglou",
            ("no installed plugin provides ffn 'swiglou'", "(did you mean 'swiglu'?)"),
            "^^^^^^^",
        ),
        ("ffn[1]=swiglu(dff=3)", ("ffn 'swiglu' has no argument 'dff'", "(did you mean 'd_ff'?)"), "^^^^^"),
        ("qkv_bias[2]=yes", ("qkv_bias expects bool, got str 'yes'",), "^^^"),
        (
            "pos[0]=learned",
            ("pos 'learned'", "adds to the token embeddings, once for every layer",
             "cannot differ by layer"),
            "^^^^^^^",
        ),
        ("pos[0]=alibi", (), None),  # alibi's bias is fine with sdpa: no error
        (
            "qk_norm[1]=rmsnorm, qk_norm_scope[0]=full",
            ("qk_norm_scope=full applies to a qk_norm", "this model has none"),
            "^^^^",
        ),
        (
            "block[2]=parallel(norms=3)",
            ("block 'parallel'", "norms=3", "a parallel block has one norm shared by attention"),
            "^^^^^^^^^^^^^^^^^",
        ),
    ],
)  # fmt: skip
def test_per_layer_errors_name_the_token_and_show_a_caret(
    tail: str, facts: tuple[str | re.Pattern[str], ...], caret: str | None
) -> None:
    """Resolving per-layer items; the grammar's errors in layer selections are in
    tests/test_syntax.py."""
    text = f"{BASE}, {tail}"
    if caret is None:
        parse_spec(text)
        return
    with raises_naming(SpecError, *facts) as e:
        parse_spec(text)
    assert str(e.value).splitlines()[-1].strip() == caret, str(e.value)


def test_per_layer_values_are_checked_before_any_allocation() -> None:
    """The size check and the shape checks run on each distinct layer, before any weight."""
    with pytest.raises(SpecError, match=r"RoPE"):
        parse_spec(
            f"{BASE.replace('num_heads=4', 'num_heads=2')}, head_dim=5, pos=nope, pos[1]=rope"
        )
    with pytest.raises(lmcore.errors.ModelTooLargeError, match=r"layers\[1\]\.ffn"):
        build_model(f"{BASE}, d_ff[1]=10000000000", device="meta", max_bytes=10**9)
    with pytest.raises(SpecError, match=r"at most 4,096 layers"):
        parse_spec(f"{base(5000)}, window[0]=2")


def test_a_presets_per_layer_items_yield_to_the_users() -> None:
    from lmcore import Preset
    from lmcore.registry import scoped_registry

    with scoped_registry() as registry:
        registry.add(Preset("alternating", f"{BASE}, window[0::2]=4, window[1]=2"))
        assert [parse_spec("alternating").at(i).window for i in range(6)] == [4, 2, 4, 0, 4, 0]
        mixed = parse_spec("alternating, window[0]=3")  # the user's layer 0 wins
        assert [mixed.at(i).window for i in range(6)] == [3, 2, 4, 0, 4, 0]
        plain = parse_spec("alternating, window=5")  # a whole-model value replaces them all
        assert [plain.at(i).window for i in range(6)] == [5] * 6


VALUES = {
    "window": st.sampled_from(["0", "2", "3", "5"]),
    "qkv_bias": st.sampled_from(["true", "false"]),
    "ffn": st.sampled_from(["swiglu", "silu", "geglu"]),
    "pos": st.sampled_from(["rope", "nope", "rope(theta=500)"]),
    "block": st.sampled_from(["prenorm", "postnorm", "sandwich", "parallel(norms=2)"]),
    "attn_softcap": st.sampled_from(["0.0", "5.0", "30"]),
    "d_ff": st.sampled_from(["32", "48"]),
    "norm": st.sampled_from(["rmsnorm", "layernorm", "rmsnorm(eps=1e-6)"]),
    "qk_norm": st.sampled_from(["none", "rmsnorm", "rmsnorm(eps=0.001)"]),
}


def spelled(draw: st.DrawFn, indices: list[int], n: int) -> str:
    """`indices` written one of several ways: each on its own (maybe from the end), or canonical."""
    if draw(st.booleans()):
        return format_layers(indices, n)
    parts = [str(i - n if draw(st.booleans()) else i) for i in indices]
    return ",".join(draw(st.permutations(parts)))


@st.composite
def layered_specs(draw: st.DrawFn) -> tuple[str, int, dict[str, list[str]]]:
    n = draw(st.integers(1, 6))
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=3, unique=True))
    values = {k: [draw(VALUES[k]) for _ in range(n)] for k in keys}
    items = [base(n).replace(", d_ff=48", "") if {"d_ff", "ffn"} & set(keys) else base(n)]
    for key, per_layer in values.items():
        whole = draw(st.sampled_from(per_layer))
        items.append(f"{key}={whole}")
        for value in dict.fromkeys(per_layer):
            if value != whole:
                layers = [i for i, v in enumerate(per_layer) if v == value]
                items.append(f"{key}[{spelled(draw, layers, n)}]={value}")
    order = [items[0], *draw(st.permutations(items[1:]))]
    return ", ".join(order), n, values


def items_base(n: int, key: str) -> str:
    return base(n).replace(", d_ff=48", "") if key in ("d_ff", "ffn") else base(n)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered_specs())
def test_per_layer_specs_round_trip_and_give_each_layer_its_value(
    case: tuple[str, int, dict[str, list[str]]],
) -> None:
    text, n, values = case
    spec = parse_spec(text)
    canonical = str(spec)
    assert " " not in canonical
    again = parse_spec(canonical)
    assert again == spec and str(again) == canonical and hash(again) == hash(spec)
    for key, per_layer in values.items():
        # Each layer's value is the one written for it, as that key alone would resolve it.
        for i, written in enumerate(per_layer):
            alone = parse_spec(f"{items_base(n, key)}, {key}={written}")
            assert getattr(spec.at(i), key) == getattr(alone, key), (key, i)
    # Another spelling of the same layers (the canonical one) is the same string.
    assert str(parse_spec(canonical.replace(",", ", "))) == canonical


def test_many_layers_resolve_in_bounded_work() -> None:
    spec = parse_spec(f"{base(4096)}, window[0::2]=4, ffn[7::9]=silu, d_ff[-1]=16")
    assert "window[0::2]=4" in str(spec) and "ffn[7::9]=silu" in str(spec)
    assert spec.at(4095).d_ff == 16 and spec.at(4094).window == 4
