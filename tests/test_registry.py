"""Discovery, provenance, isolation of broken plugins, conflicts, disabling and scoping.

Every third-party plugin here is a real distribution (a `*.dist-info` with METADATA and
entry_points.txt beside its module) on sys.path, found by importlib.metadata.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import lmcore
from lmcore import (
    AmbiguousComponentError,
    Component,
    ComponentNotFoundError,
    PluginFailedError,
    PluginLoadError,
    Preset,
    Registry,
    SpecError,
    build_model,
    parse_spec,
    scoped_registry,
    use_registry,
)
from lmcore.cli import main
from lmcore.errors import LmcoreWarning

Module = torch.nn.Module

BUILTINS = {"rmsnorm", "swiglu", "rope", "nope", "sdpa", "presets"}

# A third-party norm: the same maths as RMSNorm, so a model built with it is a real model.
OTHER_RMSNORM = """
from lmcore import Component, hookimpl
from lmcore_rmsnorm import RMSNorm

class OtherRMSNorm(RMSNorm):
    pass

@hookimpl
def lmcore_components():
    return [Component(kind="norm", name="rmsnorm", build=OtherRMSNorm, params=lambda d_model: d_model)]
"""


def _plugin(body: str) -> str:
    header = "from torch.nn import Module\nfrom lmcore import Arg, Component, Preset, hookimpl\n"
    return header + textwrap.dedent(body)


# ------------------------------------------------------------------ discovery and provenance


def test_builtins_are_declared_as_entry_points_of_the_lmcore_distribution() -> None:
    eps = {
        ep.name: ep
        for ep in md.entry_points(group="lmcore")
        if ep.dist and ep.dist.name == "lmcore-registry"
    }
    assert set(eps) >= BUILTINS
    assert eps["rope"].value == "lmcore_rope"


def test_components_carry_their_provenance(registry: Registry) -> None:
    entry = registry.get("norm", "rmsnorm")
    prov = entry.provenance
    assert (prov.dist, prov.version, prov.plugin, prov.module) == (
        "lmcore-registry", md.version("lmcore-registry"), "rmsnorm", "lmcore_rmsnorm",
    )  # fmt: skip
    assert entry.status == "ok"
    assert (
        str(prov)
        == f"lmcore-registry {md.version('lmcore-registry')} (plugin 'rmsnorm', module lmcore_rmsnorm)"
    )


def test_importing_lmcore_does_no_discovery() -> None:
    code = (
        "import sys, lmcore\n"
        "assert not any(m.startswith('lmcore_') for m in sys.modules), sorted(sys.modules)\n"
        "lmcore.parse_spec('cs336-tiny')\n"
        "assert 'lmcore_rope' in sys.modules\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_builtins_reach_the_registry_only_through_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LMCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    reg = Registry()
    assert reg.entries() == [] and reg.preset_entries() == []
    with pytest.raises(
        ComponentNotFoundError,
        match=r"entry points are not loaded \(LMCORE_DISABLE_PLUGIN_AUTOLOAD is set\)",
    ):
        reg.get("norm", "rmsnorm")


# ------------------------------------------------------------------ broken plugins

BROKEN_IMPORT = "raise ImportError('flash kernels need triton')\n"


def test_a_plugin_that_fails_to_import_is_isolated(make_dist, registry: Registry) -> None:
    make_dist(
        "lmcore-flash",
        version="0.3",
        entry_points={"flash": "flash_broken"},
        modules={"flash_broken": BROKEN_IMPORT},
    )
    [record] = [r for r in registry.plugins() if r.name == "flash"]
    assert record.status == "failed"
    assert record.provenance.dist == "lmcore-flash" and record.provenance.version == "0.3"
    assert "importing 'flash_broken' raised ImportError: flash kernels need triton" in record.reason
    # Everything else keeps working.
    model = build_model("tinystories", device="meta")
    assert str(model.spec) == str(parse_spec("tinystories"))
    with pytest.raises(
        PluginFailedError,
        match=r"attn 'flash' would come from plugin 'flash' of lmcore-flash 0.3 .*which failed to load: "
        r"importing 'flash_broken' raised ImportError: flash kernels need triton",
    ):
        registry.get("attn", "flash")
    with pytest.raises(
        SpecError, match=r"which failed to load: importing 'flash_broken' raised ImportError"
    ):
        parse_spec("tinystories, attn=flash")


def test_an_unknown_name_mentions_failed_plugins(make_dist, registry: Registry) -> None:
    make_dist(
        "lmcore-flash",
        entry_points={"flash": "flash_broken2"},
        modules={"flash_broken2": BROKEN_IMPORT},
    )
    with pytest.raises(
        ComponentNotFoundError,
        match=r"no installed plugin provides attn 'flash2'.*plugins that failed to load: 'flash' \(lmcore-flash 1.0",
    ):
        registry.get("attn", "flash2")


@pytest.mark.parametrize(
    "body, reason",
    [
        (
            """
            @hookimpl
            def lmcore_components():
                raise RuntimeError("boom")
            """,
            r"hook lmcore_components\(\) raised RuntimeError: boom at .*bad_mod\w*\.py:\d+",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [42]
            """,
            r"lmcore_components\(\) must return lmcore.Component objects, got int",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return Component(kind="norm", name="x", build=Module)
            """,
            r"hook lmcore_components\(\) must return a list, got Component",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="nrom", name="x", build=Module)]
            """,
            r"component 'x' has kind 'nrom'; kinds are attn, ffn, norm, pos \(did you mean 'norm'\?\)",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x y", build=Module)]
            """,
            r"norm component name 'x y' is not a valid name",
        ),
        (
            """
            def build(d_model): ...
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=build, args=(Arg("eps", float, 1e-5),))]
            """,
            r"norm 'x': build 'build' does not accept declared argument\(s\) eps",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=Module, args=(Arg("eps", float, "small"),))]
            """,
            r"norm 'x': default of argument 'eps' is invalid: it expects float, got str 'small'",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="attn", name="x", build=Module, features=frozenset({"gqa", "flash"}))]
            """,
            r"attn 'x': unknown feature 'flash'; attn features are bias, compile, gqa, mask",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=Module, activations=4096)]
            """,
            r"norm 'x': activations must be callable or None",
        ),
        (
            """
            def build(d_model, batch=1): ...
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=build, args=(Arg("batch", int, 1),))]
            """,
            r"norm 'x': argument 'batch' clashes with a name lmcore passes itself \(.*batch.*\)",
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=Module)] * 2
            """,
            r"norm 'x' is declared twice by this plugin",
        ),
        (
            """
            @hookimpl
            def lmcore_component():
                return []
            """,
            r"registering it raised PluginValidationError: unknown hook 'lmcore_component'",
        ),
        (
            """
            @hookimpl
            def lmcore_components(d_model):
                return []
            """,
            r"registering it raised PluginValidationError: .*d_model",
        ),
        (
            """
            @hookimpl
            def lmcore_presets():
                return [Preset("my preset", "d_model=1")]
            """,
            r"preset name 'my preset' is not a valid name",
        ),
    ],
    ids=[
        "hook-raises",
        "not-a-component",
        "not-a-list",
        "bad-kind",
        "bad-name",
        "arg-not-accepted",
        "bad-default",
        "unknown-feature",
        "activations-not-callable",
        "reserved-arg",
        "duplicate",
        "typo-hook",
        "hook-args",
        "bad-preset",
    ],
)
def test_malformed_plugins_are_recorded_as_failed_with_their_reason(
    make_dist, body: str, reason: str, request
) -> None:
    mod = "bad_mod_" + request.node.callspec.id.replace("-", "_")
    make_dist("lmcore-bad", entry_points={"bad": mod}, modules={mod: _plugin(body)})
    reg = Registry()
    [record] = [r for r in reg.plugins() if r.name == "bad"]
    assert record.status == "failed"
    assert __import__("re").search(reason, record.reason), record.reason
    assert reg.get("norm", "rmsnorm").provenance.dist == "lmcore-registry"  # the rest still loads
    # A failed plugin leaves nothing registered behind.
    assert all(e.provenance.plugin != "bad" for e in reg.entries())


def test_strict_mode_turns_a_failure_into_an_immediate_error(
    make_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dist(
        "lmcore-flash",
        entry_points={"flash": "flash_broken3"},
        modules={"flash_broken3": BROKEN_IMPORT},
    )
    message = r"plugin 'flash' from lmcore-flash 1.0 .* failed: importing 'flash_broken3' raised ImportError: flash kernels need triton"
    with pytest.raises(PluginLoadError, match=message):
        Registry(strict=True).load()
    strict = Registry(strict=True)
    for _ in range(2):  # nothing half-loaded survives a strict failure: it raises every time
        with pytest.raises(PluginLoadError, match=message):
            strict.get("norm", "rmsnorm")
    monkeypatch.setenv("LMCORE_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match=message):
        Registry().load()
    assert Registry(strict=False).get("norm", "rmsnorm")  # the keyword wins over the variable


def test_a_malformed_flag_value_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCORE_STRICT_PLUGINS", "maybe")
    with pytest.raises(
        ValueError,
        match=r"LMCORE_STRICT_PLUGINS='maybe' is not a flag; use 1/true/yes or 0/false/no",
    ):
        Registry().load()


# ------------------------------------------------------------------ conflicts


def test_two_providers_of_one_name_neither_wins(make_dist, registry: Registry) -> None:
    make_dist(
        "other-norms",
        version="2.0",
        entry_points={"other": "other_norms_a"},
        modules={"other_norms_a": OTHER_RMSNORM},
    )
    entries = [e for e in registry.entries("norm") if e.name == "rmsnorm"]
    assert sorted(e.provenance.dist for e in entries) == ["lmcore-registry", "other-norms"]
    assert {e.status for e in entries} == {"shadowed"}
    both = (
        r"norm 'rmsnorm' is provided by 2 plugins: lmcore-registry .*; other-norms 2.0 .*"
        r"Neither is chosen for you: write one of lmcore-registry:rmsnorm, other-norms:rmsnorm"
    )
    with pytest.raises(AmbiguousComponentError, match=both):
        registry.get("norm", "rmsnorm")
    with pytest.raises(SpecError, match=both):
        parse_spec("tinystories, norm=rmsnorm")
    with pytest.raises(SpecError, match=r"default norm 'rmsnorm' is unavailable: " + both):
        parse_spec("tinystories")

    model = build_model("tinystories, norm=other-norms:rmsnorm", device="meta")
    assert type(model.layers[0].ln1).__name__ == "OtherRMSNorm"
    assert str(model.spec).endswith(
        "norm=other-norms:rmsnorm,ffn=swiglu,pos=rope(theta=10000.0),attn=sdpa"
    )
    assert parse_spec(str(model.spec)) == model.spec
    # The qualifier is matched after PEP 503 normalisation.
    assert parse_spec("tinystories, norm=Other_Norms:rmsnorm") == model.spec
    builtin = build_model("tinystories, norm=lmcore-registry:rmsnorm", device="meta")
    assert type(builtin.layers[0].ln1).__name__ == "RMSNorm"


def test_qualifier_that_provides_nothing_lists_the_real_providers(
    make_dist, registry: Registry
) -> None:
    make_dist(
        "other-norms",
        entry_points={"other": "other_norms_b"},
        modules={"other_norms_b": OTHER_RMSNORM},
    )
    with pytest.raises(
        ComponentNotFoundError,
        match=r"'other-norm' does not provide norm 'rmsnorm' \(did you mean 'other-norms'\?\); it is provided by lmcore-registry, other-norms",
    ):
        registry.get("norm", "rmsnorm", provider="other-norm")


def test_disabling_one_provider_resolves_the_conflict(
    make_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dist(
        "other-norms",
        entry_points={"other": "other_norms_c"},
        modules={"other_norms_c": OTHER_RMSNORM},
    )
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "other")
    reg = Registry()
    assert reg.get("norm", "rmsnorm").provenance.dist == "lmcore-registry"
    assert [r.status for r in reg.plugins() if r.name == "other"] == ["disabled"]


# ------------------------------------------------------------------ disabling


def test_disabled_builtin_is_not_loaded_and_errors_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "rope, sdpa")
    reg = Registry()
    status = {r.name: r.status for r in reg.plugins()}
    assert status["rope"] == "disabled" and status["sdpa"] == "disabled" and status["nope"] == "ok"
    with pytest.raises(
        SpecError,
        match=r"no installed plugin provides pos 'rope'; available pos: alibi, learned, nope, sinusoidal; disabled plugins, not loaded "
        r"\(LMCORE_DISABLE_PLUGINS\): 'rope' \(lmcore-registry .*\), 'sdpa'",
    ):
        parse_spec("cs336-tiny, attn=sdpa", reg)


def test_registry_keyword_disables_too() -> None:
    reg = Registry(disabled=["rope"])
    assert "rope" not in reg.names("pos")


def test_disabling_an_unknown_name_warns_with_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "roep")
    reg = Registry()
    with pytest.warns(
        LmcoreWarning,
        match=r"LMCORE_DISABLE_PLUGINS names 'roep', but no installed plugin has that entry-point name \(did you mean 'rope'\?\)",
    ):
        reg.load()
    assert reg.problems and "roep" in reg.problems[0]


def test_autoload_off_keeps_only_programmatic_registrations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lmcore_rmsnorm

    monkeypatch.setenv("LMCORE_DISABLE_PLUGIN_AUTOLOAD", "1")
    reg = Registry()
    reg.register(lmcore_rmsnorm, name="mine")
    [entry] = reg.entries()
    assert (
        entry.name == "rmsnorm"
        and entry.provenance.dist is None
        and entry.provenance.plugin == "mine"
    )
    assert entry.provenance.qualifier == "mine"
    assert str(entry.provenance) == "registered in-process (plugin 'mine', module lmcore_rmsnorm)"


# ------------------------------------------------------------------ programmatic and scoped

SCALE = Component(
    kind="norm", name="scale", build=lambda d_model: torch.nn.Identity(), help="test-only"
)


def test_scoped_registry_does_not_leak() -> None:
    with scoped_registry() as reg:
        reg.add(
            SCALE,
            Preset(
                "tiny-scale",
                "cs336-tiny, norm=scale"[12:]
                + ", vocab_size=8, context_length=4, d_model=8, num_layers=1, num_heads=2",
            ),
        )
        assert parse_spec("tiny-scale").norm.name == "scale"
        assert lmcore.get_registry() is reg
    assert lmcore.get_registry() is not reg
    with pytest.raises(SpecError, match=r"no installed plugin provides norm 'scale'"):
        parse_spec("cs336-tiny, norm=scale")


def test_use_registry_nests_and_restores() -> None:
    outer, inner = Registry(), Registry()
    with use_registry(outer):
        with use_registry(inner):
            assert lmcore.get_registry() is inner
        assert lmcore.get_registry() is outer


def test_register_and_unregister(registry: Registry) -> None:
    name = registry.add(SCALE, name="scaler")
    prov = registry.get("norm", "scale").provenance
    assert name == "scaler" and prov.plugin == "scaler"
    assert prov.module == __name__  # where the component's factory lives
    with pytest.raises(ValueError, match=r"a plugin named 'scaler' is already registered"):
        registry.add(SCALE, name="scaler")
    registry.unregister("scaler")
    assert "scale" not in registry.names("norm")
    with pytest.raises(KeyError, match=r"no plugin named 'scaler'"):
        registry.unregister("scaler")
    with pytest.raises(KeyError, match=r"no plugin named 'rmsnrm' \(did you mean 'rmsnorm'\?\)"):
        registry.unregister("rmsnrm")


def test_programmatic_registration_fails_loudly(registry: Registry) -> None:
    bad = Component(kind="norm", name="x", build=Module, features=frozenset({"fast"}))
    with pytest.raises(PluginLoadError, match=r"norm 'x': unknown feature 'fast'"):
        registry.add(bad, name="bad")
    assert "bad" not in {r.name for r in registry.plugins()}


def test_a_programmatic_duplicate_of_a_builtin_is_a_conflict(registry: Registry) -> None:
    registry.add(Component(kind="pos", name="rope", build=Module), name="my-rope")
    with pytest.raises(
        AmbiguousComponentError, match=r"write one of lmcore-registry:rope, my-rope:rope"
    ):
        registry.get("pos", "rope")
    assert registry.get("pos", "rope", provider="my-rope").provenance.plugin == "my-rope"


def test_did_you_mean_for_components_and_presets(registry: Registry) -> None:
    with pytest.raises(
        ComponentNotFoundError,
        match=r"no installed plugin provides ffn 'swigl' \(did you mean 'swiglu'\?\); available ffn: .*swiglu",
    ):
        registry.get("ffn", "swigl")
    with pytest.raises(
        ComponentNotFoundError, match=r"preset 'gpt2-smal' \(did you mean 'gpt2-small'\?\)"
    ):
        registry.get_preset("gpt2-smal")


# ------------------------------------------------------------------ lmcore plugins


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
    assert rows["norm", "rmsnorm", "lmcore-registry", version, "ok"].endswith("eps: float = 1e-05")
    assert rows["pos", "rope", "lmcore-registry", version, "ok"].endswith("theta: float = 10000.0")
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
    assert rope["args"] == [
        {
            "name": "theta",
            "type": "float",
            "default": 10000.0,
            "required": False,
            "help": "base of the rotation frequencies",
        }
    ]


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


def test_acceptance_broken_plugin_beside_the_builtins_in_a_fresh_process(make_dist) -> None:
    site = make_dist(
        "lmcore-flash",
        version="0.3",
        entry_points={"flash": "flash_broken5"},
        modules={"flash_broken5": BROKEN_IMPORT},
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    cli = [
        sys.executable,
        "-c",
        "import sys; from lmcore.cli import main; sys.exit(main())",
        "plugins",
    ]
    listing = subprocess.run(cli, capture_output=True, text=True, env=env, check=True).stdout
    assert (
        "flash" in listing
        and "failed" in listing
        and "ImportError: flash kernels need triton" in listing
    )
    build = "import lmcore; print(lmcore.build_model('tinystories', device='meta').spec.d_model)"
    out = subprocess.run(
        [sys.executable, "-c", build], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "512"


def test_a_plugin_calling_sys_exit_at_import_is_isolated(make_dist, registry: Registry) -> None:
    make_dist(
        "lmcore-exit",
        entry_points={"quitter": "quitter_mod"},
        modules={"quitter_mod": "import sys\nsys.exit(3)\n"},
    )
    [record] = [r for r in registry.plugins() if r.name == "quitter"]
    assert (
        record.status == "failed"
        and "importing 'quitter_mod' raised SystemExit: 3" in record.reason
    )
    assert registry.get("pos", "rope").status == "ok"
