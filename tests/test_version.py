"""The versions lmcore records and prints: read without importing the package they name."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys

import pytest

from lmcore.version import __version__, versions


def test_an_imported_package_gives_its_own_version() -> None:
    import numpy

    assert versions("numpy", "python") == {
        "lmcore": __version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def test_a_package_not_imported_is_not_imported_for_its_version() -> None:
    code = (
        "import sys; from lmcore.version import versions\n"
        "print(versions('torch', 'tokenizers')); assert 'torch' not in sys.modules\n"
        "assert 'tokenizers' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    expected = {
        "lmcore": __version__,
        "torch": importlib.metadata.version("torch"),
        "tokenizers": importlib.metadata.version("tokenizers"),
    }
    assert out.stdout.strip() == str(expected)


def test_a_module_no_distribution_names_is_imported_for_its_version(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "unpackaged_probe.py").write_text("__version__ = '7.1'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "unpackaged_probe", raising=False)
    try:
        assert versions("unpackaged_probe")["unpackaged_probe"] == "7.1"
        assert "unpackaged_probe" in sys.modules
    finally:
        sys.modules.pop("unpackaged_probe", None)
