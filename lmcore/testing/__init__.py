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

from typing import TYPE_CHECKING

from lmcore.lazy import attach

if TYPE_CHECKING:
    from lmcore.testing.core import CHECKS as CHECKS
    from lmcore.testing.core import Check as Check
    from lmcore.testing.core import ConformanceError as ConformanceError
    from lmcore.testing.core import Settings as Settings
    from lmcore.testing.core import Target as Target
    from lmcore.testing.suite import Case as Case
    from lmcore.testing.suite import CaseSkipped as CaseSkipped
    from lmcore.testing.suite import SelectionError as SelectionError
    from lmcore.testing.suite import cases as cases
    from lmcore.testing.suite import select as select

__getattr__, __dir__ = attach(__name__)
