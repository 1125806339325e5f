"""The registry in use: a `scoped_registry` leaks nothing, `use_registry` nests and restores."""

from __future__ import annotations

import pytest

import lmcore
from lmcore import (
    Preset,
    Registry,
    SpecError,
    parse_spec,
    scoped_registry,
    use_registry,
)
from tests.helpers.plugins import scale_norm


def test_scoped_registry_does_not_leak() -> None:
    with scoped_registry() as reg:
        reg.add(
            scale_norm(),
            Preset(
                "tiny-scale",
                "cs336-tiny, norm=scale"[12:]
                + ", vocab_size=8, context_length=4, d_model=8, num_layers=1, num_heads=2",
            ),
        )
        assert parse_spec("tiny-scale").norm.name == "scale"
        assert lmcore.get_registry() is reg
    assert lmcore.get_registry() is not reg
    with pytest.raises(SpecError, match=r"no installed plugin provides norm 'scale'"):
        parse_spec("cs336-tiny, norm=scale")


def test_use_registry_nests_and_restores() -> None:
    outer, inner = Registry(), Registry()
    with use_registry(outer):
        with use_registry(inner):
            assert lmcore.get_registry() is inner
        assert lmcore.get_registry() is outer
