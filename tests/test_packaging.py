"""pyproject.toml declares every built-in plugin module, and each through an entry point."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
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


def _editable_wheel(checkout: Path, out: Path) -> Path:
    """The wheel `pip install -e` installs, built by the project's own backend (no isolation)."""
    code = "import sys; from setuptools import build_meta; print(build_meta.build_editable(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=checkout,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out / done.stdout.split()[-1]


def test_an_editable_install_imports_from_the_checkouts_parent(tmp_path: Path) -> None:
    """From the directory holding the checkout (a folder named lmcore without an __init__.py),
    `import lmcore` is the package, not the folder as an empty namespace package: the editable
    install is a .pth of paths, searched with the rest of sys.path (setuptools' default import
    hook runs after that search and loses to the folder). PYTHONPATH still comes first."""
    checkout = tmp_path / "lmcore"
    shutil.copytree(
        ROOT / "lmcore", checkout / "lmcore", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(
        ROOT / "plugins", checkout / "plugins", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    wheel = _editable_wheel(checkout, tmp_path / "dist")
    site = tmp_path / "site"  # the wheel's top level, as pip puts it in site-packages
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site, [n for n in z.namelist() if "/" not in n])
    pth = [p.read_text() for p in site.glob("*.pth")]
    assert pth == [f"{checkout.resolve()}\n{checkout.resolve() / 'plugins'}\n"]

    def python(code: str, **env: str) -> str:
        # This environment's own editable install (this checkout, as a .pth) is left out, so
        # that the copy's is the only lmcore installed; then its .pth, as the interpreter's
        # start reads one.
        ours = [p for p in (str(ROOT), str(ROOT / "plugins")) if p != env.get("PYTHONPATH")]
        setup = (
            f"import site, sys; sys.path[:] = [p for p in sys.path if p not in {ours!r}]; "
            f"site.addsitedir({str(site)!r})\n"
        )
        environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
        done = subprocess.run(
            [sys.executable, "-c", setup + code],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    built = "import lmcore; print(lmcore.__file__, lmcore.build_model('cs336-tiny', device='meta').blueprint.spec.d_model)"
    assert python(built) == f"{checkout / 'lmcore' / '__init__.py'} 64"
    assert python("import lmcore; print(lmcore.__file__)", PYTHONPATH=str(ROOT)) == str(
        ROOT / "lmcore" / "__init__.py"
    )
