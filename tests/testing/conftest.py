"""Fixtures of the conformance kit's tests."""

from __future__ import annotations

import pytest

from tests.helpers.kit import PLANTED, PlantedRegistry


@pytest.fixture(scope="session")
def kit_warmed_up() -> None:
    """pytester's in-process runs unload every module first imported inside them, and torch's
    compiler cannot be imported twice: run the kit once here first, so that every module it
    needs is loaded for good (and is not re-imported by each run)."""
    from lmcore.testing import Settings, cases

    for case in cases(PlantedRegistry(*PLANTED[:3]).registry):
        if case.skip_reason is None:
            case.run(Settings(compile_backend="eager"))
