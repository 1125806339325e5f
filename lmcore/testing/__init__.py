"""lmcore's conformance kit: the contract of each component kind, as executable checks.

Run it on installed components with pytest (the plugin `lmcore.testing.plugin` is registered
under the ``pytest11`` entry point, and does nothing unless asked)::

    pytest --lmcore-conformance                          # every registered component
    pytest --lmcore-conformance --lmcore-component dyt   # one (or dist:name)
    pytest --lmcore-conformance --lmcore-kind attn       # one kind

or from Python: ``for case in cases(get_registry()): case.run()``.

Names are imported lazily (PEP 562), so loading the pytest plugin stays cheap for test suites
that never pass ``--lmcore-conformance``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcore.testing.core import CHECKS, Check, ConformanceError, Settings, Target
    from lmcore.testing.suite import Case, CaseSkipped, SelectionError, cases, select

__all__ = [
    "CHECKS",
    "Case",
    "CaseSkipped",
    "Check",
    "ConformanceError",
    "SelectionError",
    "Settings",
    "Target",
    "cases",
    "select",
]

_WHERE = {
    "CHECKS": "core",
    "Check": "core",
    "ConformanceError": "core",
    "Settings": "core",
    "Target": "core",
    "Case": "suite",
    "CaseSkipped": "suite",
    "SelectionError": "suite",
    "cases": "suite",
    "select": "suite",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lmcore.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lmcore.testing.{_WHERE[name]}"), name)
