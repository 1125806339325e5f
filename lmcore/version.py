"""lmcore's version, and the versions that the files lmcore writes record.

    from lmcore.version import __version__, versions
    versions("torch")              # {"lmcore": "0.1.0", "torch": "2.13.0+cpu"}
    versions("torch", "python")    # ... and "python": "3.11.7" (what `lmcore --version` prints)

The one place `__version__` is defined: the package root re-exports it, and checkpoints,
training runs and prepared data take their version records from `versions()`, so no module
imports the package root for it. A package is imported only when its version is asked for.
"""

from __future__ import annotations

import platform
from importlib import import_module
from typing import Final

__all__ = ["__version__", "versions"]

__version__: Final = "0.1.0"


def versions(*names: str) -> dict[str, str]:
    """`{"lmcore": __version__}` and, in the order given, the version of each named package
    (imported by name: "torch", "tokenizers", "numpy", ...); "python" is the interpreter's."""
    found = {"lmcore": __version__}
    for name in names:
        if name == "python":
            found[name] = platform.python_version()
        else:
            found[name] = str(getattr(import_module(name), "__version__", "?"))
    return found
