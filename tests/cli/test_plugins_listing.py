"""`lmcore plugins`: the table (kind, name, distribution, version, status, arguments or the
reason), --json and --kind, shadowed rows, and a plugin that declares nothing."""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest

from lmcore import (
    Registry,
)
from lmcore.cli.main import main
from tests.helpers.plugins import BROKEN_IMPORT, OTHER_RMSNORM


def test_plugins_table_lists_kind_name_dist_version_status_args(
    make_dist, registry: Registry, capsys
) -> None:
    make_dist(
        "lmcore-flash",
        version="0.3",
        entry_points={"flash": "flash_broken4"},
        modules={"flash_broken4": BROKEN_IMPORT},
    )
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["KIND", "NAME", "DIST", "VERSION", "STATUS", "ARGS", "/", "REASON"]
    rows = {tuple(line.split()[:5]): line for line in out[1:]}
    version = md.version("lmcore-registry")
    rmsnorm = rows["norm", "rmsnorm", "lmcore-registry", version, "ok"]
    assert rmsnorm.endswith("eps: float = 1e-05, zero_centered: bool = false")
    rope = rows["pos", "rope", "lmcore-registry", version, "ok"]
    assert "ok      theta: float = 10000.0, fraction: float = 1.0, scaling: str = none" in rope
    assert ("preset", "tinystories", "lmcore-registry", version, "ok") in rows
    failed = rows["-", "flash", "lmcore-flash", "0.3", "failed"]
    assert "importing 'flash_broken4' raised ImportError: flash kernels need triton" in failed


def test_plugins_json_and_kind_filter(registry: Registry, capsys) -> None:
    assert main(["plugins", "--json", "--kind", "pos"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in data["components"]} == {"pos"}
    rope = next(r for r in data["components"] if r["name"] == "rope")
    assert (
        rope["dist"] == "lmcore-registry"
        and rope["plugin"] == "rope"
        and rope["module"] == "lmcore_rope"
    )
    assert rope["args"][0] == {
        "name": "theta",
        "type": "float",
        "default": 10000.0,
        "required": False,
        "help": "base of the rotation frequencies",
    }
    assert [(a["name"], a["type"], a["default"]) for a in rope["args"][1:]] == [
        ("fraction", "float", 1.0), ("scaling", "str", "none"), ("factor", "float", 1.0),
        ("low_freq_factor", "float", 1.0), ("high_freq_factor", "float", 4.0),
        ("original_context_length", "int", 8192), ("beta_fast", "float", 32.0),
        ("beta_slow", "float", 1.0), ("truncate", "bool", True),
        ("attention_factor", "float", 0.0), ("mscale", "float", 0.0),
        ("mscale_all_dim", "float", 0.0),
    ]  # fmt: skip


def test_shadowed_rows_say_how_to_choose(make_dist, registry: Registry, capsys) -> None:
    make_dist(
        "other-norms",
        entry_points={"other": "other_norms_d"},
        modules={"other_norms_d": OTHER_RMSNORM},
    )
    main(["plugins", "--kind", "norm"])
    out = capsys.readouterr().out
    assert (
        "shadowed" in out
        and "(ambiguous: write other-norms:rmsnorm)" in out
        and "(ambiguous: write lmcore-registry:rmsnorm)" in out
    )


def test_a_plugin_that_declares_nothing_is_listed(make_dist, registry: Registry, capsys) -> None:
    source = "from lmcore import hookimpl\n@hookimpl\ndef lmcore_components():\n    return []\n"
    make_dist("lmcore-empty", entry_points={"empty": "empty_mod"}, modules={"empty_mod": source})
    assert main(["plugins"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if " empty " in f" {line} "]
    assert row.split()[:5] == ["-", "empty", "lmcore-empty", "1.0", "empty"]
    assert row.endswith("loaded, but declares no components or presets")


def test_lmcore_plugins_lists_the_component_valued_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lmcore.cli.main import main

    assert main(["plugins", "--kind", "ffn"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.split()[1:2] == ["moe"])
    assert "expert: ffn = swiglu" in line and "shared: ffn = none" in line
