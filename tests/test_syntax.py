"""The spec grammar: tokens, numbers (bounded), quoted strings and qualifiers, layer selections;
an error with a caret for every malformed text, in work linear in its length; any text at all
gives a spec or a short SpecError."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcore import SpecError, parse_spec
from lmcore.components import format_scalar
from tests.helpers.errors import raises_naming


@pytest.mark.parametrize(
    "text, message, caret",
    [
        ("", r"empty spec", "^"),
        ("tinystories,", r"trailing ','", "^"),
        ("tinystories d_model=1", r"expected ',' between items, found 'd_model'", "^^^^^^^"),
        ("tinystories, d_model=1e5x", r"malformed number '1e5x'", "^^^^"),
        ("tinystories, norm=rmsnorm(eps=1, eps=2)", r"argument 'eps' is given twice", "^^^"),
        (
            "tinystories, norm=rmsnorm(eps=1",
            r"expected ',' or '\)' in the argument list, found end of spec",
            "^",
        ),
        ("tinystories; d_model=1", r"unexpected character ';'", "^"),
        ('tinystories, norm=rmsnorm(eps="1)', r"unterminated string: add the closing \"", "^^^"),
        ("tinystories(x=1)", r"'tinystories' takes no arguments here", "^^^^^^^^^^^^^^^^"),
    ],
)
def test_errors_name_the_token_and_show_a_caret(text: str, message: str, caret: str) -> None:
    """The grammar's errors; those of resolution are in tests/blueprint/test_origins.py."""
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(text)
    rendered = str(info.value).splitlines()
    assert rendered[-1].strip() == caret, str(info.value)
    if text:
        # The caret sits under the token the message is about.
        err = info.value
        assert rendered[-2].strip() == text.strip().splitlines()[0].strip() or "\n" in text
        assert err.spec == text and 0 <= err.start < max(len(text), 1) + 1


BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=6, num_heads=4, d_ff=48"


@pytest.mark.parametrize(
    ("tail", "facts", "caret"),
    [
        (
            "window[6]=2",
            ("window[...]: layer 6 is out of range", "num_layers=6, so layers are 0..5",
             "(or -6..-1 from the end)"),
            "^",
        ),
        ("window[4:2]=2", ("selects no layer of the 6",), "^^^"),
        ("window[0::-1]=2", ("a layer range's step must be at least 1, got -1",), "^^^^^"),
        ("window[x]=2", ("layer indices are integers", "(e.g. 3, -1, 2:5, 1::2)", "found 'x'"), "^"),
        ("window[1.5]=2", ("layer indices are integers", "found '1.5'"), "^^^"),
        ("window[]=2", ("expected a layer index or range", "(e.g. 3, -1, 2:5, 1::2)", "found ']'"), "^"),
        (
            "window[0=2",
            ("expected ']' closing the layers", "(or ',' before another range)", "found '='"),
            "^",
        ),
        ("window[0]2", ("expected '=' after window[...]", "found '2'"), "^"),
    ],
)  # fmt: skip
def test_per_layer_errors_name_the_token_and_show_a_caret(
    tail: str, facts: tuple[str, ...], caret: str
) -> None:
    """The grammar of layer selections; the errors of resolving them are in
    tests/blueprint/test_layers.py."""
    with raises_naming(SpecError, *facts) as e:
        parse_spec(f"{BASE}, {tail}")
    assert str(e.value).splitlines()[-1].strip() == caret, str(e.value)


@pytest.mark.parametrize(
    "value",
    [
        0,
        -3,
        10_000,
        1e-5,
        2.5,
        10000.0,
        True,
        False,
        "abc",
        "a b",
        'q"x',
        "true",
        "1e5",
        "",
        "x\\y\n",
    ],
)
def test_scalars_format_to_text_that_parses_back(value) -> None:
    spec = parse_spec("tinystories")
    # Round trip through a component argument of a made-up spec line: format, then tokenize.
    text = format_scalar(value)
    from lmcore.syntax import _tokenize

    tok = _tokenize(text)[0]
    assert tok.value == value and type(tok.value) is type(value)
    assert spec.d_model == 512


_ALPHABET = st.sampled_from(
    [*"abcdrt_-.:,=()[]'\" 0123456789eE+", "tinystories", "d_model", "norm", "rope", "window"]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_ALPHABET, max_size=25).map("".join))
def test_malformed_specs_raise_only_spec_errors(text: str) -> None:
    try:
        spec = parse_spec(text)
    except SpecError as e:
        assert e.message and str(e)
    else:
        assert parse_spec(str(spec)) == spec


def calls(fn: Callable[[], object]) -> int:
    """Python and C function calls made by `fn()` (whatever it raises): a measure of work
    that, unlike time, does not depend on the machine."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        fn()
    except SpecError:
        pass
    finally:
        sys.setprofile(None)
    return count


def parse(text: str) -> Callable[[], object]:
    return lambda: parse_spec(text)


def test_parsing_is_linear_in_the_length_of_the_spec() -> None:
    """The reproduction: thousands of arguments (the duplicate check was quadratic)."""
    parse_spec("tinystories")  # the registry loads once, outside the count

    def args(n: int) -> str:
        return "tinystories, norm=rmsnorm(" + ", ".join(f"a{i}=1" for i in range(n)) + ")"

    small, large = calls(parse(args(2_000))), calls(parse(args(16_000)))
    assert large < 9 * small, (small, large)  # 8 times the text: 8 times the work, not 64
    strings = [f'tinystories, norm=rmsnorm(eps="{"x" * n}")' for n in (10_000, 1_000_000)]
    assert calls(parse(strings[1])) < 2 * calls(parse(strings[0]))  # one regular expression


def test_a_huge_spec_gives_a_short_message_with_a_caret_window() -> None:
    text = "tinystories, norm=rmsnorm(" + ", ".join(f"a{i}=1" for i in range(100_000)) + ")"
    with pytest.raises(SpecError, match=r"norm 'rmsnorm' has no argument 'a0'") as info:
        parse_spec(text)
    lines = str(info.value).splitlines()
    assert len(lines) == 3 and all(len(line) < 300 for line in lines), lines
    assert lines[1].endswith("...") and lines[2].strip() == "^^^^"  # under a0=1
    assert lines[1].index("a0") == lines[2].index("^")
    long_name = "x" * 100_000
    with pytest.raises(SpecError) as info:
        parse_spec(f"tinystories, pos={long_name}")
    assert len(str(info.value)) < 2_000 and "(100,000 characters)" in str(info.value)


@pytest.mark.parametrize(
    "text, facts",
    [
        (  # any huge integer given to a float argument: was OverflowError
            "tinystories, pos=rope(theta=1" + "0" * 400 + ")",
            (re.compile(r"number '10000.*'"), "(401 characters) is too long",
             "a spec's numbers have at most 64 characters"),
        ),
        (  # the SwiGLU default width of a 400-digit d_model: was OverflowError
            "vocab_size=10, context_length=8, num_layers=1, num_heads=1, d_model=1" + "0" * 399,
            (re.compile(r"number .* is too long"),),
        ),
        (  # Python's int-to-str limit: was ValueError: Exceeds the limit (4300 digits)
            "tinystories, d_model=" + "1" * 5000,
            (re.compile(r"number .* \(5,000 characters\) is too long"),),
        ),
        (  # parsed as valid, then failed in torch.empty with a C++ frame dump
            "tinystories, d_model=1" + "0" * 40,
            ("integer 1" + "0" * 40 + " is out of range",
             "a spec's integers lie within ±(2**63 - 1) = ±9,223,372,036,854,775,807"),
        ),
        ("tinystories, d_model=-9223372036854775808", ("is out of range",)),
        ("tinystories, pos=rope(theta=1e400)", ("number '1e400' is out of range",)),
    ],
)  # fmt: skip
def test_numbers_are_bounded(text: str, facts: tuple[str | re.Pattern[str], ...]) -> None:
    with raises_naming(SpecError, *facts):
        parse_spec(text)


def test_the_largest_integer_is_accepted() -> None:
    spec = parse_spec("tinystories, pos=rope(theta=9223372036854775807)")
    assert spec.pos.kwargs == {"theta": 9.223372036854776e18}
    with pytest.raises(SpecError, match=r"d_model=9223372036854775807 is not divisible"):
        parse_spec("tinystories, d_model=9223372036854775807")


def test_a_quoted_distribution_qualifies_a_name() -> None:
    """A distribution name that is not a plain name (`2norms`, `my norms`) is quoted."""
    spec = parse_spec("tinystories, norm=\"lmcore-registry\":rmsnorm, pos='lmcore-registry':rope")
    assert spec == parse_spec("tinystories")
    with pytest.raises(SpecError, match=r"'2norms' does not provide norm 'rmsnorm'"):
        parse_spec('tinystories, norm="2norms":rmsnorm')
    with raises_naming(
        SpecError,
        "malformed number '2norms'",
        '(quote a distribution name that is not a plain name: "2norms":...)',
    ):
        parse_spec("tinystories, norm=2norms:rmsnorm")


def test_a_quoted_value_is_still_a_string_and_cannot_stand_alone() -> None:
    with pytest.raises(SpecError, match=r"norm takes a component, e.g. norm=rmsnorm"):
        parse_spec('tinystories, norm="rmsnorm"')
    with pytest.raises(SpecError, match=r"expected key=value or a preset name"):
        parse_spec('"tinystories"')


_TOKENS = st.sampled_from(
    [
        *"abcdrt_-.:,=()'\" 0123456789eE+\\\n\t;é€\x00",
        "tinystories", "cs336-tiny", "d_model", "num_heads", "norm", "rope", "rmsnorm", "ffn",
        "swiglu", "theta", "eps", "d_ff", "=1", "=0", "=-1", "=1e-5", "=1e400", "=true",
        '"lmcore-registry":', '"2norms":', "lmcore-registry:", "9223372036854775807",
        "9223372036854775808", "1" * 70, "1_000", "0.5", "1e5x", '"a\\qb"', "'unterminated",
        "(eps=1)", "(theta=1" + "0" * 30 + ")", ", d_model=512", ", num_heads=7",
        "[", "]", "[0::2]", "[-1]", "[1:3,5]", ", window", "[0]=3", ", ffn[1]=silu",
        ", qk_norm=rmsnorm(eps=1e-6)", "(expert=swiglu(d_ff=3))", ", block=parallel(norms=2)",
        ", head_dim=8", ", attn_softcap=5.0", ", qkv_bias=true", "none",
    ]
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_TOKENS, max_size=30).map("".join))
def test_any_text_gives_a_spec_or_a_short_spec_error(text: str) -> None:
    """Whatever the text, parse_spec returns a spec that round-trips, or raises SpecError with
    a bounded message; never another exception (benchmarks/fuzz_spec.py runs 100,000+)."""
    try:
        spec = parse_spec(text)
    except SpecError as e:
        assert e.message and len(str(e)) < 4_000
    else:
        assert parse_spec(str(spec)) == spec
