"""Fixtures of the blueprint tests."""

from __future__ import annotations

import pytest

import lmcore.blueprint
from lmcore.blueprint import Blueprint


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every spec text resolved while the test runs, in order."""
    seen: list[str] = []
    real = lmcore.blueprint._Resolver.resolve

    def counting(self: lmcore.blueprint._Resolver) -> Blueprint:
        seen.append(self.text)
        return real(self)

    monkeypatch.setattr(lmcore.blueprint._Resolver, "resolve", counting)
    return seen
