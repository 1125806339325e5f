"""Packages whose names are imported on first use (PEP 562), each name listed once.

    # lmcore/data/__init__.py
    from typing import TYPE_CHECKING

    from lmcore.lazy import attach

    if TYPE_CHECKING:
        from lmcore.data.tokens import TokenData as TokenData

    __getattr__, __dir__ = attach(__name__)

The package's `if TYPE_CHECKING:` block is its one listing: type checkers read each `A as A`
there as a public name (an explicit re-export), and `attach` reads the same block from the
package's source with `ast` when the package is first asked for a name it does not hold (never
at import time: `import lmcore` stays cheap), then imports a name's module when the name is
first asked for. `__all__` is served from the listing too. An import there without the
redundant alias (`from x import A`) is for annotations only, not a public name. (The idea is
scientific-python's lazy_loader `attach_stub`, reading the package itself instead of a stub.)
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["attach", "listed"]


def attach(
    package: str, before: Callable[[], None] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for the package named `package`, from its listing.
    `before` runs before each name's first import (lmcore's guard for torch's)."""
    found: dict[str, tuple[str, str]] = {}

    def names() -> dict[str, tuple[str, str]]:
        if not found:
            found.update(listed(_source(package), package))
        return found

    def __getattr__(name: str) -> Any:
        module = sys.modules[package]
        if name == "__all__":
            value: Any = list(names())
        elif name in names():
            if before is not None:
                before()
            where = importlib.import_module(names()[name][0])
            # every name from that module at once: later lookups skip this function. (No listed
            # name is also a submodule's: importing that submodule would rebind the name.)
            for public, (module_name, original) in names().items():
                if module_name == where.__name__:
                    setattr(module, public, getattr(where, original))
            return getattr(module, name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names()})

    return __getattr__, __dir__


def listed(source: str, package: str) -> dict[str, tuple[str, str]]:
    """{public name: (module, name there)} of the `if TYPE_CHECKING:` blocks at the top level
    of a package's `source`: every `from MODULE import NAME as NAME` (relative ones resolved
    against `package`)."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and _type_checking(node.test)):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom):
                where = importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), package)
                for a in stmt.names:
                    if a.asname is not None and a.asname == a.name:
                        out[a.asname] = (where, a.name)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _source(package: str) -> str:
    """The package's source: its `__init__.py`, else what its loader has (a zip import)."""
    module = sys.modules[package]
    path = getattr(module, "__file__", None)
    if path is not None and path.endswith(".py") and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    get_source = getattr(getattr(module.__spec__, "loader", None), "get_source", None)
    source = None if get_source is None else get_source(package)
    if source is None:
        raise ImportError(
            f"{package} lists its names in its source, which is not installed (only bytecode?): "
            "reinstall lmcore from its wheel or sdist",
            name=package,
        )
    return str(source)
