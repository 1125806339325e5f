"""The values lmcore derives: the one d_ff rule (the preset's width, an ffn's own default, an
explicit one), a plugin's default width checked, a derived width within the integer range."""

from __future__ import annotations

import pytest

from lmcore import (
    Component,
    ComponentSpec,
    SpecError,
    parse_spec,
    scoped_registry,
)
from tests.helpers.errors import raises_naming


def test_ffn_d_ff_argument_is_the_models_d_ff() -> None:
    spec = parse_spec("tinystories, ffn=swiglu(d_ff=2048)")
    assert spec.d_ff == 2048 and spec.ffn == ComponentSpec("swiglu")


def test_changing_the_ffn_drops_the_presets_width_but_not_an_explicit_one() -> None:
    assert parse_spec("cs336-tiny, ffn=swiglu").d_ff == 128  # same ffn: the preset's width stays
    # Another ffn takes its own default width, not the preset's 128 (which was SwiGLU's) ...
    assert parse_spec("cs336-tiny, ffn=geglu").d_ff == 192  # 8/3 · 64 rounded to 64
    assert parse_spec("cs336-tiny, ffn=silu").d_ff == 256  # 4 · 64
    # ... unless the spec gives one, as a key or as the ffn's argument.
    assert parse_spec("cs336-tiny, ffn=silu, d_ff=128").d_ff == 128
    assert parse_spec("cs336-tiny, ffn=geglu(d_ff=96)").d_ff == 96


def test_without_a_preset_the_ffns_default_width_applies() -> None:
    spec = parse_spec("vocab_size=10, context_length=4, d_model=512, num_layers=1, num_heads=8")
    assert spec.d_ff == 1344


def ffn_with_default(width: object) -> Component:
    return Component(
        kind="ffn",
        name="odd",
        build=lambda d_model, d_ff: None,
        default_d_ff=lambda d_model: width,
    )


@pytest.mark.parametrize(
    "width, facts",
    [
        (0, ("its default_d_ff gives default_d_ff(d_model=64) = 0", "it must give a whole number >= 1")),
        (1382.4, ("its default_d_ff gives default_d_ff(d_model=64) = 1382.4", "it must give a whole number >= 1")),
        ("wide", ("its default_d_ff gives default_d_ff(d_model=64) = 'wide'", "it must give a whole number")),
        (2**63, ("default_d_ff of ffn 'odd'", "gives d_ff=9,223,372,036,854,775,808",
                 "beyond the largest integer a spec can hold (2**63 - 1)", "give d_ff=... explicitly")),
    ],
)  # fmt: skip
def test_a_plugins_default_width_is_checked(width: object, facts: tuple[str, ...]) -> None:
    with scoped_registry() as reg:
        reg.add(ffn_with_default(width), name="odd-ffns")
        # Every message names the component and the plugin it came from.
        with raises_naming(
            SpecError, "ffn 'odd' from registered in-process (plugin 'odd-ffns'", *facts
        ):
            parse_spec("cs336-tiny, ffn=odd")


def test_a_whole_float_default_width_is_taken_and_round_trips() -> None:
    with scoped_registry() as reg:
        reg.add(ffn_with_default(1344.0), name="odd-ffns")
        spec = parse_spec("cs336-tiny, ffn=odd")
        assert spec.d_ff == 1344 and type(spec.d_ff) is int
        assert parse_spec(str(spec)) == spec


def test_a_derived_width_beyond_the_integer_range_is_refused() -> None:
    text = "vocab_size=1, context_length=1, num_layers=1, num_heads=1, d_model=4611686018427387904, ffn=silu"
    with raises_naming(
        SpecError, "the default d_ff = 4·d_model", "gives d_ff=18,446,744,073,709,551,616"
    ):
        parse_spec(text)
