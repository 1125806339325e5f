"""Asserting the facts an error or a warning names, not its glue words."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# ---------------------------------------------------------------------------------------------
# Errors: assert the facts a message exists to carry, not its glue words
# ---------------------------------------------------------------------------------------------


def _missing(message: str, facts: tuple[str | re.Pattern[str], ...]) -> list[str | re.Pattern[str]]:
    for fact in facts:
        if not isinstance(fact, (str, re.Pattern)):
            raise TypeError(f"a fact is a str or a compiled regex, not {type(fact).__name__}")
    return [
        fact
        for fact in facts
        if (fact.search(message) is None if isinstance(fact, re.Pattern) else fact not in message)
    ]


def assert_naming(message: str, *facts: str | re.Pattern[str]) -> None:
    """`message` (a report, a reason, an output) names every fact, as `raises_naming` checks."""
    missing = _missing(message, facts)
    if missing:
        shown = ", ".join(repr(fact) for fact in missing)
        raise AssertionError(f"the text does not name {shown}; it reads:\n{message}")


@contextmanager
def raises_naming(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    *facts: str | re.Pattern[str],
) -> Iterator[pytest.ExceptionInfo[BaseException]]:
    """Like `pytest.raises(exc_type)`, and the message names every fact.

    A fact is a plain substring of `str(excinfo.value)` (the offending token, its position, the
    valid choices, the suggestion, the file) or a compiled regex searched in it. A missing fact
    fails the test, naming the fact and the whole message:

        with raises_naming(SpecError, "unknown key 'd_modle'", "did you mean 'd_model'"):
            parse_spec("tinystories, d_modle=512")
    """
    _missing("", facts)  # a malformed fact is refused before the block runs
    with pytest.raises(exc_type) as excinfo:
        yield excinfo
    message = str(excinfo.value)
    missing = _missing(message, facts)
    if missing:
        shown = ", ".join(repr(fact) for fact in missing)
        raise AssertionError(
            f"{type(excinfo.value).__name__} does not name {shown}; its message:\n{message}"
        )


@contextmanager
def warns_naming(
    category: type[Warning], *facts: str | re.Pattern[str]
) -> Iterator[pytest.WarningsRecorder]:
    """Like `pytest.warns(category)`, and one warning of that category names every fact."""
    _missing("", facts)
    with pytest.warns(category) as record:
        yield record
    messages = [str(w.message) for w in record if issubclass(w.category, category)]
    if not any(not _missing(message, facts) for message in messages):
        shown = ", ".join(repr(fact) for fact in facts)
        raise AssertionError(
            f"no {category.__name__} names all of {shown}; the warnings:\n" + "\n".join(messages)
        )
