"""Hooks the conformance plugin adds to pytest; implement them in a conftest.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from lmcore.registry import Registry


@pytest.hookspec(firstresult=True)
def pytest_lmcore_registry(config: pytest.Config) -> Registry | None:
    """Return the `lmcore.Registry` whose components ``--lmcore-conformance`` checks.

    Default: ``lmcore.get_registry()``, i.e. every installed plugin. Implement it in the
    rootdir's conftest.py to check components before they are packaged, e.g.
    ``reg = Registry(autoload=False); reg.add(my_component); return reg``.
    """
