"""lmcore's version, and the versions that the files lmcore writes record.

    from lmcore.version import __version__, versions
    versions("torch")              # {"lmcore": "0.1.0", "torch": "2.13.0+cpu"}
    versions("torch", "python")    # ... and "python": "3.11.7" (what `lmcore --version` prints)

The one place `__version__` is defined: the package root re-exports it, and checkpoints,
training runs and prepared data take their version records from `versions()`, so no module
imports the package root for it. No package is imported for its version: one already imported
gives its `__version__`, another its installed distribution's (`importlib.metadata`), so that
`lmcore --version` answers without the seconds torch takes to import.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from importlib import import_module
from typing import Final

__all__ = ["__version__", "versions"]

__version__: Final = "0.1.0"


def versions(*names: str) -> dict[str, str]:
    """`{"lmcore": __version__}` and, in the order given, the version of each named package
    ("torch", "tokenizers", "numpy", ...: a module whose distribution has the same name);
    "python" is the interpreter's."""
    found = {"lmcore": __version__}
    for name in names:
        found[name] = platform.python_version() if name == "python" else _version_of(name)
    return found


def _version_of(name: str) -> str:
    """The version of module `name`, imported only when no installed distribution names it (a
    module on the path that pip did not install)."""
    loaded = sys.modules.get(name)
    if loaded is None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            loaded = import_module(name)
    return str(getattr(loaded, "__version__", "?"))
