"""Finding the plugins: the entry points of the group `lmcore`, other tools' and plugins' malformed
metadata (reported, never raised), and torch's import kept working beside it.

Every third-party plugin here is a real distribution (a `*.dist-info` with METADATA and
entry_points.txt beside its module) on sys.path, found by importlib.metadata."""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys

import pytest

from lmcore import (
    Registry,
)
from tests.helpers.errors import assert_naming

BUILTINS = {"rmsnorm", "swiglu", "rope", "nope", "sdpa", "presets"}


def test_builtins_are_declared_as_entry_points_of_the_lmcore_distribution() -> None:
    eps = {
        ep.name: ep
        for ep in md.entry_points(group="lmcore")
        if ep.dist and ep.dist.name == "lmcore-registry"
    }
    assert set(eps) >= BUILTINS
    assert eps["rope"].value == "lmcore_rope"


def test_another_tools_malformed_entry_points_never_reach_lmcore(tmp_path, monkeypatch) -> None:
    info = tmp_path / "unrelated_tool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unrelated-tool\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nbroken-line-without-equals\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError):  # what importlib.metadata itself does with it
        md.entry_points(group="lmcore")
    registry = Registry()
    assert registry.get("norm", "rmsnorm").status == "ok"
    assert all(r.status == "ok" for r in registry.plugins())
    from lmcore.registry import malformed_entry_points

    assert malformed_entry_points() == [
        "unrelated_tool-1.0.dist-info/entry_points.txt line 2, 'broken-line-without-equals', "
        "has no '='"
    ]


def test_a_plugin_distribution_without_a_name_is_reported_and_the_rest_loads(
    tmp_path, monkeypatch
) -> None:
    info = tmp_path / "nameless_norms-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lmcore]\nnameless = nameless_mod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    [record] = [r for r in registry.plugins() if r.status == "failed"]
    assert (record.name, record.provenance.dist, record.provenance.version) == (
        "nameless",
        "nameless_norms",
        "1.0",
    )
    assert record.reason.startswith("the METADATA of nameless_norms cannot be read (")
    assert record.reason.endswith("); reinstall it")
    assert registry.get("norm", "rmsnorm").status == "ok"


def test_a_malformed_entry_points_file_does_not_break_the_cli_in_a_fresh_process(
    tmp_path,
) -> None:
    """torch's own import reads every distribution's entry points and fails on this file; lmcore
    switches torch's device-backend autoload off for the process, with a warning naming it."""
    info = tmp_path / "unrelated_tool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: unrelated-tool\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nbroken-line-without-equals\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    cli = [sys.executable, "-c", "import sys; from lmcore.cli.main import main; sys.exit(main())"]
    out = subprocess.run(
        [*cli, "build", "cs336-tiny", "--device", "meta"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "parameters: 1,403,328"
    assert (
        out.stderr.startswith(
            "lmcore build: warning: malformed distribution metadata: unrelated_tool-1.0.dist-info/"
            "entry_points.txt line 2, 'broken-line-without-equals', has no '='. importing torch "
            "would fail on it"
        )
        and out.stderr.count("\n") == 1
    )


def test_a_plugin_with_unreadable_metadata_is_failed_not_fatal(tmp_path, monkeypatch) -> None:
    info = tmp_path / "lmcore_latin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(
        b"Metadata-Version: 2.1\nName: lmcore-latin\nSummary: caf\xe9\n"
    )
    (info / "entry_points.txt").write_text("[lmcore]\nlatin = latin_mod\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    [record] = [r for r in registry.plugins() if r.name == "latin"]
    assert record.status == "failed" and record.provenance.dist == "lmcore_latin"
    assert_naming(
        record.reason,
        "the METADATA of lmcore_latin cannot be read (UnicodeDecodeError: ",
        "); reinstall it",
    )
    assert registry.get("norm", "rmsnorm").status == "ok"


def test_a_plugins_malformed_entry_points_are_its_failure(tmp_path, monkeypatch) -> None:
    info = tmp_path / "lmcore_broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lmcore-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[lmcore]\nno-equals-here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    [record] = [r for r in registry.plugins() if r.provenance.dist == "lmcore-broken"]
    assert record.status == "failed" and "its entry_points.txt cannot be parsed" in record.reason
    assert registry.get("pos", "rope").status == "ok"
