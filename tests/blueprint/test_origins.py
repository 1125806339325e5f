"""Where each value of a spec was written, and the SpecError that points there: every resolution
error names the token with a caret under it (under the preset's name for a preset's value), a
multi-line spec shows the offending line, a checked value's problem is placed under it."""

from __future__ import annotations

import re

import pytest

from lmcore import SpecError, parse_spec
from lmcore.components import Arg
from lmcore.errors import ValueProblem, ValueTypeProblem
from lmcore.syntax import parse_items
from tests.helpers.errors import raises_naming


@pytest.mark.parametrize(
    "text, facts, caret",
    [
        (
            "tinystories, d_modle=512",
            ("unknown key 'd_modle'", "(did you mean 'd_model'?)", "keys are vocab_size"),
            "^^^^^^^",
        ),
        (
            "tinysories",
            ("no installed plugin provides preset 'tinysories'", "(did you mean 'tinystories'?)",
             "available preset: cs336-tiny, gpt2-large"),
            "^^^^^^^^^^",
        ),
        (
            "tinystories, pos=roap",
            ("no installed plugin provides pos 'roap'", "(did you mean 'rope'?)",
             re.compile(r"available pos: .*nope.*rope")),
            "^^^^",
        ),
        (
            "tinystories, norm=rmsnorm(epsilon=1)",
            ("norm 'rmsnorm' has no argument 'epsilon'", "(did you mean 'eps'?)", "it takes: eps"),
            "^^^^^^^^^",
        ),
        (
            "tinystories, norm=rmsnorm(eps=true)",
            ("argument 'eps' of norm 'rmsnorm'", "expects float, got bool true"),
            "^^^^^^^^",
        ),
        (
            "tinystories, norm=rmsnorm(eps=x)",
            ("argument 'eps' of norm 'rmsnorm'", "expects float, got str 'x'"),
            "^^^^^",
        ),
        (
            "tinystories, pos=rope(theta=0)",
            ("argument 'theta' of pos 'rope'", "must be > 0.0, got 0.0"),
            "^^^^^^^",
        ),
        (
            "tinystories, d_model=512, d_model=256",
            ("key 'd_model' is given twice", "(first at position 13)"),
            "^^^^^^^",
        ),
        (
            "tinystories, num_heads=7",
            ("d_model=512 is not divisible by num_heads=7", "num_heads that divide it: 1, 2, 4, 8"),
            "^",
        ),
        (
            "tinystories, d_model=96, num_heads=32",
            ("pos 'rope'", "RoPE rotates pairs of dimensions",
             "head_dim = d_model / num_heads = 3 is odd"),
            "^^",
        ),
        ("tinystories, d_model=abc", ("d_model expects int, got str 'abc'",), "^^^"),
        ("tinystories, d_model=0", ("d_model must be >= 1, got 0",), "^"),
        ("tinystories, d_model=5.0", ("d_model expects int, got float 5.0",), "^^^"),
        (
            "tinystories, pos=nope, cs336-tiny",
            ("a bare name ('cs336-tiny') is a preset", "can only come first"),
            "^^^^^^^^^^",
        ),
        (
            "tinystories, norm=5",
            ("norm takes a component", "e.g. norm=rmsnorm or norm=name(arg=value)", "got '5'"),
            "^",
        ),
        (
            "tinystories, d_model=rmsnorm(eps=1)",
            ("d_model takes a plain int, not a component",),
            "^^^^^^^^^^^^^^",
        ),
        ("tinystories, num_kv_heads=3", ("num_kv_heads=3 must divide num_heads=16",), "^"),
        (
            "tinystories, block=postnrom",
            ("no installed plugin provides block 'postnrom'", "(did you mean 'postnorm'?)",
             re.compile(r"available block: .*parallel, postnorm, prenorm")),
            "^^^^^^^^",
        ),
        (
            "tinystories, d_ff=100, ffn=swiglu(d_ff=1)",
            ("d_ff is given twice", "as a model key and as an argument of ffn"),
            "^^^^",
        ),
        (
            "tinystories, pos=rope(theta=x(y=1))",
            ("argument 'theta' of pos 'rope'", "expects float, got a component"),
            "^^^^^^^^^^^^",
        ),
        (
            "tinystories, norm=foo:rmsnorm",
            ("'foo' does not provide norm 'rmsnorm'", "it is provided by lmcore-registry"),
            "^^^^^^^^^^^",
        ),
        (
            "vocab_size=10",
            ("missing context_length", "(longest sequence the model accepts)",
             "add context_length=... or start with a preset"),
            "^^^^^^^^^^^^^",
        ),
    ],
)  # fmt: skip
def test_errors_name_the_token_and_show_a_caret(
    text: str, facts: tuple[str | re.Pattern[str], ...], caret: str
) -> None:
    """Resolution's errors; those of the grammar are in tests/test_syntax.py."""
    with raises_naming(SpecError, *facts) as info:
        parse_spec(text)
    rendered = str(info.value).splitlines()
    assert rendered[-1].strip() == caret, str(info.value)
    # The caret sits under the token the message is about.
    err = info.value
    assert rendered[-2].strip() == text.strip().splitlines()[0].strip() or "\n" in text
    assert err.spec == text and 0 <= err.start < max(len(text), 1) + 1


def test_multi_line_spec_shows_only_the_offending_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec("tinystories,\n  d_model=512,\n  d_modle=3")
    lines = str(info.value).splitlines()
    assert lines[-2] == "    d_modle=3" and lines[-1] == "    ^^^^^^^"


def test_errors_from_preset_values_point_at_the_preset() -> None:
    with pytest.raises(SpecError, match=r"d_model=64 is not divisible by num_heads=3") as info:
        parse_spec("cs336-tiny, num_heads=3")
    assert str(info.value).splitlines()[-1].strip() == "^"


def test_a_checked_value_says_what_is_wrong_and_its_caller_says_where() -> None:
    """`Arg.check` and a layer range's `select` raise a `ValueProblem` (still a ValueError, the
    type's a TypeError too); resolution places it under the value."""
    eps = Arg("eps", float, 1e-5, gt=0.0)
    with pytest.raises(ValueProblem, match=r"^must be > 0.0, got -1.0$"):
        eps.check(-1.0)
    with pytest.raises(ValueTypeProblem, match=r"^expects float, got str 'x'$"):
        eps.check("x")
    assert issubclass(ValueProblem, ValueError) and issubclass(ValueTypeProblem, TypeError)
    [item] = parse_items("d_ff[5]=64")
    with pytest.raises(ValueProblem, match=r"^layer 5 is out of range: num_layers=4"):
        (item.layers or ())[0].select(4)
    with pytest.raises(SpecError, match=r"d_ff\[\.\.\.\]: layer 5 is out of range") as e:
        parse_spec("cs336-tiny, d_ff[5]=64")
    assert e.value.start == len("cs336-tiny, d_ff[")
