"""Plain helpers and constants the tests import (`from tests.helpers import TINY_SPEC`).

Fixtures live in the conftest.py of the directory that needs them; what is here is imported.
Add to the end of this file, in a section headed with your area.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# ---------------------------------------------------------------------------------------------
# Errors: assert the facts a message exists to carry, not its glue words
# ---------------------------------------------------------------------------------------------


@contextmanager
def raises_naming(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    *facts: str | re.Pattern[str],
) -> Iterator[pytest.ExceptionInfo[BaseException]]:
    """Like `pytest.raises(exc_type)`, and the message names every fact.

    A fact is a plain substring of `str(excinfo.value)` (the offending token, its position, the
    valid choices, the suggestion, the file) or a compiled regex searched in it. A missing fact
    fails the test, naming the fact and the whole message:

        with raises_naming(SpecError, "'rmsnrom'", "position 7", "did you mean 'rmsnorm'"):
            parse_spec("norm=rmsnrom")
    """
    for fact in facts:
        if not isinstance(fact, (str, re.Pattern)):
            raise TypeError(f"a fact is a str or a compiled regex, not {type(fact).__name__}")
    with pytest.raises(exc_type) as excinfo:
        yield excinfo
    message = str(excinfo.value)
    missing = [
        fact
        for fact in facts
        if (fact.search(message) is None if isinstance(fact, re.Pattern) else fact not in message)
    ]
    if missing:
        shown = ", ".join(repr(fact) for fact in missing)
        raise AssertionError(
            f"{type(excinfo.value).__name__} does not name {shown}; its message:\n{message}"
        )


# ---------------------------------------------------------------------------------------------
# Training: a tiny model and a tiny corpus
# ---------------------------------------------------------------------------------------------

TINY_SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"


def tiny_corpus(root: Path) -> Path:
    """A small text with structure a tiny model learns in a few hundred steps: a few "functions"
    repeated with small variations, one per document."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(24):
        lines = [
            f"def f{(i + k) % 5}(x):\n    return x * {k % 3} + {(i * k) % 4}\n" for k in range(12)
        ]
        (root / f"doc{i:02d}.py").write_text("".join(lines), encoding="utf-8")
    return root
