"""pyproject.toml declares every built-in plugin module, and each through an entry point."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_plugin_module_is_packaged_and_has_an_entry_point() -> None:
    modules = {p.stem for p in (ROOT / "plugins").glob("*.py")}
    assert modules, "plugins/ holds the built-in plugin modules"
    assert set(PROJECT["tool"]["setuptools"]["py-modules"]) == modules
    entry_points = PROJECT["project"]["entry-points"]["lmcore"]
    assert {value.split(":")[0] for value in entry_points.values()} == modules
    assert not (ROOT / "plugins" / "__init__.py").exists(), "no top-level package named plugins"


def test_builtins_are_top_level_modules_named_lmcore_something() -> None:
    for name in PROJECT["project"]["entry-points"]["lmcore"].values():
        module = name.split(":")[0]
        assert module.startswith("lmcore_") and "." not in module


def test_every_package_under_lmcore_is_in_the_wheel() -> None:
    """An editable install finds a package missing from the list; a wheel would leave it out."""
    found = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "lmcore").rglob("__init__.py")
    }
    assert set(PROJECT["tool"]["setuptools"]["packages"]) == found
