"""The checks of a resolved model's shape: heads that divide the width (in bounded work), and the
attention kernel against the features the model asks of it."""

from __future__ import annotations

import pytest

from lmcore import SpecError, parse_spec, scoped_registry
from lmcore.blueprint import divisors_near
from tests.helpers.errors import raises_naming
from tests.helpers.plugins import plain_kernel


def test_the_divisor_suggestion_does_not_grow_with_d_model() -> None:
    """`describe "gpt2-small, d_model=1099511627776"` looped over every integer up to d_model
    (about 16 h); the suggestion now looks at a window around num_heads."""
    with raises_naming(
        SpecError,
        "d_model=1099511627776 is not divisible by num_heads=12",
        "num_heads that divide it: 2, 4, 8, 16",
    ):
        parse_spec("gpt2-small, d_model=1099511627776")
    assert divisors_near(2**62, 7) == [1, 2, 4, 8]
    assert divisors_near(2**61 - 1, 12) == [1, 2**61 - 1]  # a prime: only 1 and itself
    assert divisors_near(512, 7) == [1, 2, 4, 8]
    assert divisors_near(3 * 5 * 7 * 11 * 13, 1000) == [715, 1001, 1155, 1365]


BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=3, num_heads=4, d_ff=48"


@pytest.mark.parametrize(
    ("option", "facts"),
    [
        (
            "window=4",
            ("attn 'plain' cannot compute a sliding window (window=4)",
             "it does not declare the 'window' feature", "kernels that can: chunked, sdpa"),
        ),
        (
            "attn_softcap=5.0",
            ("attn 'plain' cannot compute capped scores (attn_softcap=5.0)",
             "it does not declare the 'softcap' feature", "kernels that can: chunked, sdpa"),
        ),
        ("window[1]=4", ("attn 'plain' cannot compute a sliding window (window=4)",)),
    ],
)  # fmt: skip
def test_a_kernel_without_a_feature_is_refused_at_spec_time_by_name(
    option: str, facts: tuple[str, ...]
) -> None:
    with scoped_registry() as registry:
        registry.add(plain_kernel(frozenset({"gqa"})))  # declares none of the options
        with raises_naming(SpecError, *facts) as e:
            parse_spec(f"{BASE}, attn=plain, {option}")
    caret = str(e.value).splitlines()
    assert (
        caret[-2]
        .strip()
        .endswith(option.split("=")[-1] if "[" not in option else option.split("=")[1])
    )
