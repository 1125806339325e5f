"""How `pip install -e .` installs this checkout; everything else is declared in pyproject.toml.

setuptools' default editable install for a layout like this one (the package at the root, the
built-in plugins' modules in plugins/) is an import hook that Python asks only after its own
search of `sys.path`. That search starts in the current directory, so from the checkout's parent
it finds the checkout folder (named `lmcore`, without an `__init__.py`) and imports it as an empty
namespace package: `import lmcore; lmcore.build_model(...)` fails with an AttributeError. Here an
editable install puts the checkout's root and plugins/ on `sys.path` with a `.pth` file instead,
as `setup.py develop` did: a real package found anywhere on `sys.path` wins over a namespace
folder, and the search still runs in its usual order (`PYTHONPATH` and the current directory
first), so a second checkout on `PYTHONPATH` is still the one imported. Files added to the
checkout are importable at once, as before.

An editable mode asked for explicitly (`--config-settings editable_mode=strict`) is setuptools'
own. tests/test_packaging.py installs a fresh environment with the README's command and imports
lmcore from the checkout's parent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.editable_wheel import editable_wheel

ROOT = Path(__file__).resolve().parent


class EditableByPath(editable_wheel):
    """setuptools' `editable_wheel`, with a `.pth` of the root and plugins/ as its default."""

    def _select_strategy(self, name: str, tag: str, build_lib: Any) -> Any:
        try:
            from setuptools.command.editable_wheel import _StaticPth
        except ImportError:  # a setuptools without it: its own default, the import hook
            _StaticPth = None
        if self.mode or _StaticPth is None:
            return super()._select_strategy(name, tag, build_lib)
        return _StaticPth(self.distribution, name, [ROOT, ROOT / "plugins"])


if (
    __name__ == "__main__"
):  # as setuptools runs it; with the root on sys.path, `import setup` is inert
    setup(cmdclass={"editable_wheel": EditableByPath})
