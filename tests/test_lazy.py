"""Lazy packages (`lmcore.lazy`): each lists its public names once, in its `TYPE_CHECKING` block;
importing one imports none of them, asking for a name imports its module only."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmcore.lazy import attach, listed

LAZY = ["lmcore", "lmcore.data", "lmcore.hf", "lmcore.gguf", "lmcore.testing"]


def test_a_lazy_package_serves_every_listed_name_and_only_those() -> None:
    code = f"""
import importlib, pkgutil
from pathlib import Path
from lmcore.lazy import listed
for name in {LAZY!r}:
    package = importlib.import_module(name)
    names = listed(Path(package.__file__).read_text(encoding="utf-8"), name)
    for m in pkgutil.iter_modules(package.__path__):  # as `import lmcore.data.preparing` does
        if m.name != "__main__":
            importlib.import_module(f"{{name}}.{{m.name}}")
    assert names and package.__all__ == list(names), name
    for public, (module, original) in names.items():  # no submodule's import rebound one
        assert getattr(package, public) is getattr(importlib.import_module(module), original), public
        assert public in dir(package)
    try:
        package.nothing_here
    except AttributeError as e:
        print(e)
"""  # a fresh process: every submodule is imported by its path before any name is asked for
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        f"module '{name}' has no attribute 'nothing_here'" for name in LAZY
    ]


@pytest.mark.parametrize("name", LAZY)
def test_no_listed_name_is_also_a_submodules(name: str) -> None:
    # `import lmcore.data.prepare` would bind the module over the function `lmcore.data.prepare`
    package = importlib.import_module(name)
    names = listed(Path(package.__file__ or "").read_text(encoding="utf-8"), name)
    submodules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert submodules and names
    assert sorted(submodules & set(names)) == []


@pytest.mark.parametrize("name", LAZY)
def test_the_listing_is_the_only_spelling_of_the_names(name: str) -> None:
    path = Path(importlib.import_module(name).__file__ or "")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assigned = {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert not assigned & {"__all__", "_WHERE"}
    assert not [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]


def test_importing_the_lazy_packages_imports_none_of_their_names() -> None:
    code = (
        "import sys\n"
        f"for name in {LAZY!r}: __import__(name)\n"
        "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('lmcore_') or m in "
        "('lmcore.data.tokens', 'lmcore.hf.convert', 'lmcore.gguf.convert', 'lmcore.registry', "
        "'lmcore.testing.core', 'lmcore.blueprint')]\n"
        "assert not loaded, loaded\n"
        "import lmcore.data\n"
        "lmcore.data.EOT\n"
        "assert 'lmcore.data.meta' in sys.modules and 'lmcore.data.tokens' not in sys.modules\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_attach_reads_redundant_aliases_resolves_relative_imports_and_runs_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "lazypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from lmcore.lazy import attach\n"
        "if TYPE_CHECKING:\n"
        "    from lazypkg.one import A as A\n"
        "    from .two import B as B\n"
        "    from lazypkg.two import Hint\n"  # for annotations only: not public
        "CALLS = []\n"
        "__getattr__, __dir__ = attach(__name__, before=lambda: CALLS.append(1))\n"
    )
    (pkg / "one.py").write_text("A = 'a'\n")
    (pkg / "two.py").write_text("B = 'b'\nHint = int\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lazypkg  # type: ignore[import-not-found]

    assert "lazypkg.one" not in sys.modules and lazypkg.CALLS == []
    assert lazypkg.__all__ == ["A", "B"]
    assert (lazypkg.A, lazypkg.B, lazypkg.CALLS) == ("a", "b", [1, 1])
    assert lazypkg.A == "a" and lazypkg.CALLS == [1, 1]  # once a name is there, no more calls
    with pytest.raises(AttributeError):
        _ = lazypkg.Hint
    for mod in ("lazypkg", "lazypkg.one", "lazypkg.two"):
        sys.modules.pop(mod, None)


def test_attach_returns_its_two_functions() -> None:
    getattr_, dir_ = attach("lmcore.gguf")
    assert callable(getattr_) and "read_gguf" in dir_()
