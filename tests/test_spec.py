"""The spec's data: the canonical form of a `ModelSpec` (presets expanded, defaults dropped, one
string per model) and its round trips; the canonical layer selections."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcore import ComponentSpec, ModelSpec, SpecError, parse_spec
from lmcore.spec import format_layers, parse_items

TINY = (
    "vocab_size=10000,context_length=16,d_model=64,num_layers=3,num_heads=4,num_kv_heads=4,"
    "d_ff=128,block=prenorm,tie_embeddings=false,norm=rmsnorm(eps=1e-05),ffn=swiglu,"
    "pos=rope(theta=10000.0),attn=sdpa"
)


def test_preset_expands_to_the_canonical_string() -> None:
    spec = parse_spec("cs336-tiny")
    assert str(spec) == TINY
    assert spec == ModelSpec(
        vocab_size=10000, context_length=16, d_model=64, num_layers=3, num_heads=4,
        num_kv_heads=4, d_ff=128, block=ComponentSpec("prenorm"), tie_embeddings=False,
        norm=ComponentSpec("rmsnorm", (("eps", 1e-5),)), ffn=ComponentSpec("swiglu"),
        pos=ComponentSpec("rope", (("theta", 10000.0),)), attn=ComponentSpec("sdpa"),
    )  # fmt: skip


def test_design_examples_parse() -> None:
    full = parse_spec(
        """vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344,
           norm=rmsnorm(eps=1e-5), ffn=swiglu, pos=rope(theta=10000), attn=sdpa"""
    )
    assert full == parse_spec("tinystories")
    nope = parse_spec("tinystories, pos=nope")
    assert nope.pos == ComponentSpec("nope") and nope.d_model == 512


def test_later_keys_override_the_preset_and_whitespace_is_ignored() -> None:
    spec = parse_spec("  tinystories ,d_model = 256 ,\n num_heads=8,pos = rope( theta = 500 )")
    assert (spec.d_model, spec.num_heads, spec.pos.kwargs) == (256, 8, {"theta": 500.0})


def test_number_spellings() -> None:
    a = parse_spec("tinystories, vocab_size=10_000, pos=rope(theta=1e4)")
    b = parse_spec("tinystories, vocab_size=10000, pos=rope(theta=10000.0)")
    assert a == b and str(a) == str(b)


def test_equal_models_have_equal_canonical_strings() -> None:
    variants = [
        "tinystories",
        "tinystories, norm=rmsnorm",
        "tinystories, norm=rmsnorm(eps=0.00001), attn=sdpa, ffn=swiglu",
        "tinystories, num_kv_heads=16, block=prenorm, tie_embeddings=false",
        "tinystories, ffn=swiglu(d_ff=1344)",
        "tinystories, d_ff=1344",
        "tinystories, norm=lmcore-registry:rmsnorm",  # an unambiguous qualifier is dropped
    ]
    assert len({str(parse_spec(v)) for v in variants}) == 1


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


_SPACE = st.sampled_from(["", " ", "  ", "\n", "\t "])


def _int_text(n: int) -> st.SearchStrategy[str]:
    plain = str(n)
    grouped = f"{n:_}"
    return st.sampled_from([plain, grouped])


NEW_KEYS = {
    "qkv_bias": ["true", "false"],
    "out_bias": ["true", "false"],
    "qk_norm": ["none", "rmsnorm", "rmsnorm(eps=1e-6)", "layernorm(bias=false)"],
    "window": ["0", "3", "64"],
    "attn_softcap": ["0.0", "50.0", "20"],
    "logit_softcap": ["0.0", "30.0"],
    "embed_scale": ["1.0", "8.0"],
    "window[0]": ["2", "0"],
    "ffn[-1]": ["silu", "swiglu"],
}


@st.composite
def valid_specs(draw: st.DrawFn) -> str:
    items: list[str] = []
    preset = draw(st.sampled_from([None, "cs336-tiny", "tinystories", "gpt2-small", "gpt2-xl"]))
    if preset:
        items.append(preset)
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([2, 4, 8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8) if heads % h == 0]))
    keys: dict[str, str] = {}
    if preset is None or draw(st.booleans()):
        keys |= {
            "vocab_size": draw(_int_text(draw(st.integers(1, 100_000)))),
            "context_length": draw(_int_text(draw(st.integers(1, 4096)))),
            "d_model": str(heads * head_dim),
            "num_layers": str(draw(st.integers(1, 8))),
            "num_heads": str(heads),
        }
        if draw(st.booleans()):
            keys["num_kv_heads"] = str(kv)
    if draw(st.booleans()):
        keys["d_ff"] = draw(_int_text(draw(st.integers(1, 5000))))
    if draw(st.booleans()):
        keys["block"] = draw(
            st.sampled_from(["prenorm", "postnorm", "sandwich", "reordered", "parallel(norms=2)"])
        )
    for key, values in NEW_KEYS.items():  # keys written only when they differ from the default
        if draw(st.integers(0, 3)) == 0:
            keys[key] = draw(st.sampled_from(values))
    if draw(st.booleans()):
        keys["tie_embeddings"] = draw(st.sampled_from(["true", "false"]))
    if draw(st.booleans()):
        eps = draw(st.floats(1e-12, 1.0, allow_nan=False))
        keys["norm"] = draw(
            st.sampled_from(["rmsnorm", f"rmsnorm(eps={eps!r})", "lmcore-registry:rmsnorm"])
        )
    if draw(st.booleans()):
        theta = draw(st.one_of(st.integers(1, 10**6).map(str), st.floats(1.0, 1e7).map(repr)))
        keys["pos"] = draw(st.sampled_from(["nope", "rope", f"rope(theta={theta})", "rope()"]))
    if draw(st.booleans()):
        keys["ffn"] = draw(st.sampled_from(["swiglu", "swiglu(d_ff=96)"]))
        if "d_ff" in keys and "(" in keys["ffn"]:
            del keys["d_ff"]
    if draw(st.booleans()):
        keys["attn"] = "sdpa"
    order = draw(st.permutations(list(keys)))
    items += [f"{k}{draw(_SPACE)}={draw(_SPACE)}{keys[k]}" for k in order]
    return f",{draw(_SPACE)}".join(items)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_specs())
def test_canonical_round_trip(text: str) -> None:
    try:
        spec = parse_spec(text)
    except SpecError as e:  # generated shapes can be invalid for RoPE (odd head_dim)
        assert re.search(r"RoPE rotates pairs|divisible", e.message), e
        return
    canonical = str(spec)
    assert " " not in canonical
    again = parse_spec(canonical)
    assert again == spec
    assert str(again) == canonical
    assert hash(again) == hash(spec)


def selected(text: str, n: int) -> list[int]:
    [item] = parse_items(f"window[{text}]=1")
    assert item.layers is not None
    return sorted(i for r in item.layers for i in r.select(n))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 24).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))
    )
)
def test_the_canonical_layers_name_exactly_the_layers_given(case: tuple[int, set[int]]) -> None:
    n, layers = case
    text = format_layers(sorted(layers), n)
    assert selected(text, n) == sorted(layers)
    assert format_layers(selected(text, n), n) == text
    assert " " not in text and len(text.split(",")) <= len(layers)
