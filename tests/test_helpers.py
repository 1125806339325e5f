"""tests/helpers/errors.py: the fact checks the error tests lean on catch a missing fact and name it."""

from __future__ import annotations

import re
import warnings

import pytest

from tests.helpers.errors import assert_naming, raises_naming, warns_naming


def test_raises_naming_passes_when_every_fact_is_named() -> None:
    with raises_naming(ValueError, "'d_modle'", re.compile(r"position \d+")) as info:
        raise ValueError("unknown key 'd_modle' at position 13")
    assert isinstance(info.value, ValueError)  # the ExceptionInfo, as pytest.raises gives it


def test_raises_naming_names_the_missing_fact_and_the_message() -> None:
    with (
        pytest.raises(AssertionError) as info,
        raises_naming(ValueError, "'d_modle'", "did you mean 'd_model'"),
    ):
        raise ValueError("unknown key 'd_modle'")
    assert str(info.value) == (
        "ValueError does not name \"did you mean 'd_model'\"; its message:\nunknown key 'd_modle'"
    )
    with (
        pytest.raises(AssertionError, match=r"does not name re\.compile\('at \\\\d'\)"),
        raises_naming(ValueError, re.compile(r"at \d")),
    ):
        raise ValueError("at x")


def test_raises_naming_is_pytest_raises_for_the_type() -> None:
    with (
        pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"),
        raises_naming(ValueError, "x"),
    ):
        pass
    with (
        pytest.raises(KeyError),
        raises_naming(ValueError, "x"),
    ):  # another type passes through, as with pytest.raises
        raise KeyError("x")
    with raises_naming((KeyError, ValueError), "x"):
        raise KeyError("x")


def test_a_fact_is_a_string_or_a_regex() -> None:
    with (
        pytest.raises(TypeError, match="a fact is a str or a compiled regex, not int"),
        raises_naming(ValueError, 5),
    ):  # type: ignore[arg-type]
        raise ValueError("5")


def test_assert_naming_checks_a_text() -> None:
    assert_naming("layer 6 is out of range", "layer 6", re.compile(r"out of \w+"))
    with pytest.raises(AssertionError, match=r"the text does not name 'layer 7'"):
        assert_naming("layer 6 is out of range", "layer 7")


def test_warns_naming_needs_one_warning_naming_every_fact() -> None:
    with warns_naming(UserWarning, "'roep'", "did you mean 'rope'"):
        warnings.warn("unrelated", UserWarning, stacklevel=1)
        warnings.warn("names 'roep' (did you mean 'rope'?)", UserWarning, stacklevel=1)
    with (
        pytest.raises(AssertionError, match=r"no UserWarning names all of \"'roep'\", \"'rope'\""),
        warns_naming(UserWarning, "'roep'", "'rope'"),
    ):
        warnings.warn("names 'roep'", UserWarning, stacklevel=1)
        warnings.warn("names 'rope'", UserWarning, stacklevel=1)
