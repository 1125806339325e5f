"""lmcore's own components pass its conformance kit: every check on every registered component
(the built-ins, and any third-party plugin installed in the environment, e.g. lmcore-dyt in
tox's `dyt` environments).

The compile check uses the aot_eager backend here: it traces each forward with Dynamo and
AOTAutograd like inductor does, without generating C++ (see COMPILE_BACKEND). Plugin authors get
inductor by default (`pytest --lmcore-conformance`); LMCORE_COMPILE_BACKEND=inductor does the same
here.
"""

from __future__ import annotations

import os

import pytest

from lmcore.components import ALL_KINDS
from lmcore.registry import get_registry
from lmcore.testing import Case, Settings, cases

# Inductor on CPU adds ~1-2 s of C++ compilation per component (and more for the first);
# aot_eager keeps lmcore's own suite fast. LMCORE_COMPILE_BACKEND=inductor checks the real thing.
COMPILE_BACKEND = os.environ.get("LMCORE_COMPILE_BACKEND", "aot_eager")
CASES = cases(get_registry())


def test_every_kind_has_registered_components_under_test() -> None:
    assert {c.target.kind for c in CASES} == set(ALL_KINDS)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.check.name}:{c.param_id}" for c in CASES])
def test_registered_component_conforms(case: Case) -> None:
    if case.skip_reason:
        pytest.skip(case.skip_reason)
    case.run(Settings(compile_backend=COMPILE_BACKEND))
