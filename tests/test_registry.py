"""Discovery, provenance, isolation of broken plugins, conflicts, disabling and scoping.

Every third-party plugin here is a real distribution (a `*.dist-info` with METADATA and
entry_points.txt beside its module) on sys.path, found by importlib.metadata.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

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
from lmcore.cli.main import main
from lmcore.errors import LmcoreWarning, PluginNameError, SlowPluginWarning
from lmcore.registry.loading import Plugins

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
            r"component 'x' has kind 'nrom'; kinds are attn, block, ffn, norm, pos \(did you mean 'norm'\?\)",
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
            r"attn 'x': unknown feature 'flash'; attn features are bias, compile, gqa, mask, nocache",
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
    with pytest.raises(PluginNameError, match=r"a plugin named 'scaler' is already registered"):
        registry.add(SCALE, name="scaler")
    assert issubclass(PluginNameError, ValueError)  # what callers caught before it had a name
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
        ("original_context_length", "int", 8192),
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
        "import sys; from lmcore.cli.main import main; sys.exit(main())",
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


# ------------------------------------------------------------------ concurrency (issue 11)


def test_concurrent_first_use_loads_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 threads ask a fresh registry at once, 25 registries in a row: every thread sees every
    preset (one used to see a registry that had marked itself loaded before it finished), and
    each registry scans its entry points once."""
    scans: list[Plugins] = []  # kept alive, so that no two registries share an id
    real = Plugins._load_entry_points

    def counting(self: Plugins, *args: object) -> None:
        scans.append(self)
        time.sleep(0.01)  # widen the window a racing thread would fall into
        real(self, *args)

    monkeypatch.setattr(Plugins, "_load_entry_points", counting)
    for _ in range(25):
        registry = Registry()
        barrier = threading.Barrier(8)
        seen: list[object] = []

        def ask(
            registry: Registry = registry,
            barrier: threading.Barrier = barrier,
            seen: list[object] = seen,
        ) -> None:
            barrier.wait()
            try:
                seen.append(parse_spec("tinystories", registry).d_model)
            except Exception as e:
                seen.append(e)

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [512] * 8, seen
        assert sum(scanned is registry._plugins for scanned in scans) == 1


def test_eight_threads_in_a_fresh_interpreter_all_find_the_preset() -> None:
    """The reproduction as written: the default registry, first used by 8 threads at once."""
    code = textwrap.dedent("""
        import threading, lmcore
        errors, registries, barrier = [], set(), threading.Barrier(8)
        def go():
            barrier.wait()
            try:
                lmcore.parse_spec("tinystories")
                registries.add(id(lmcore.get_registry()))
            except Exception as e:
                errors.append(e)
        threads = [threading.Thread(target=go) for _ in range(8)]
        [t.start() for t in threads]; [t.join() for t in threads]
        print(len(errors), errors[:1], len(registries))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0 [] 1"  # no failure, and one default registry for all


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_another_thread_loads_waits_and_the_child_sees_a_whole_registry(
    make_dist,
) -> None:
    make_dist(
        "lmcore-slow",
        entry_points={"slow": "slow_norm_mod"},
        modules={"slow_norm_mod": "import time\ntime.sleep(0.5)\n" + OTHER_RMSNORM},
    )
    registry = Registry()
    loader = threading.Thread(target=registry.load)
    loader.start()
    while registry._plugins.loading is None and not registry._plugins.loaded:
        time.sleep(0.005)
    with warnings.catch_warnings():  # Python 3.12+ warns about fork() with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: a whole registry, or exit status 1
        loaded = registry._plugins.loaded
        ok = loaded and {r.name for r in registry.plugins()} >= {"slow", "rmsnorm"}
        os._exit(0 if ok else 1)
    loader.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ------------------------------------------------------------------ metadata and interrupts


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
    assert re.search(
        r"the METADATA of lmcore_latin cannot be read \(UnicodeDecodeError: .*\); reinstall it",
        record.reason,
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


@pytest.mark.parametrize(
    "module, reason",
    [
        ("raise KeyboardInterrupt\n", r"importing 'kbi_\w+' raised KeyboardInterrupt at "),
        (
            "from lmcore import hookimpl\n@hookimpl\ndef lmcore_components():\n"
            "    raise KeyboardInterrupt\n",
            r"hook lmcore_components\(\) raised KeyboardInterrupt at ",
        ),
    ],
    ids=["at-import", "in-hook"],
)
def test_a_plugin_raising_keyboard_interrupt_is_isolated(
    make_dist, module: str, reason: str, request
) -> None:
    name = "kbi_" + request.node.callspec.id.replace("-", "_")
    make_dist("lmcore-kbi", entry_points={"kbi": name}, modules={name: module})
    registry = Registry()
    [record] = [r for r in registry.plugins() if r.name == "kbi"]
    assert record.status == "failed" and re.search(reason, record.reason), record.reason
    assert registry.get("norm", "rmsnorm").status == "ok"


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT to itself")
def test_a_real_ctrl_c_while_loading_still_interrupts(make_dist) -> None:
    make_dist(
        "lmcore-press",
        entry_points={"press": "press_ctrl_c"},
        modules={
            "press_ctrl_c": "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
            "time.sleep(1)\n"
        },
    )
    registry = Registry()
    # Python's own Ctrl-C handler, whatever this process inherited: a background job of a
    # non-interactive shell (`pytest &` in a script) starts with SIGINT ignored.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            registry.load()
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert not registry._plugins.loaded  # nothing half-loaded: the next use starts over


# ------------------------------------------------------------------ plugin faults (issue 11)


def test_an_argument_name_that_is_not_a_string_is_named(make_dist, registry: Registry) -> None:
    body = """
        @hookimpl
        def lmcore_components():
            return [Component(kind="norm", name="odd", build=Module, args=(Arg(name=5, type=int, default=1),))]
    """
    make_dist(
        "lmcore-argname",
        entry_points={"argname": "argname_mod"},
        modules={"argname_mod": _plugin(body)},
    )
    [record] = [r for r in registry.plugins() if r.name == "argname"]
    assert record.status == "failed"
    assert record.reason == "norm 'odd': an argument's name must be a string, got int 5"


def test_a_preset_declared_twice_by_one_plugin_fails_it(make_dist, registry: Registry) -> None:
    body = """
        @hookimpl
        def lmcore_presets():
            return [Preset("twice", "cs336-tiny"), Preset("once", "cs336-tiny"), Preset("twice", "tinystories")]
    """
    make_dist(
        "lmcore-twice", entry_points={"twice": "twice_mod"}, modules={"twice_mod": _plugin(body)}
    )
    [record] = [r for r in registry.plugins() if r.name == "twice"]
    assert (record.status, record.reason) == (
        "failed",
        "preset 'twice' is declared twice by this plugin",
    )
    assert "once" not in registry.preset_names()  # none of the plugin's presets is kept


def test_a_preset_from_two_plugins_is_ambiguous(registry: Registry) -> None:
    small = "vocab_size=8, context_length=4, d_model=8, num_layers=1, num_heads=2"
    registry.add(Preset("tinystories", small), name="my-presets")
    with pytest.raises(
        SpecError,
        match=r"preset 'tinystories' is provided by 2 plugins: .*write one of "
        r"lmcore-registry:tinystories, my-presets:tinystories",
    ):
        parse_spec("tinystories", registry)
    assert parse_spec("my-presets:tinystories", registry) == parse_spec(small, registry)


@pytest.mark.parametrize("dist", ["2norms", "my norms"])
def test_every_qualified_name_lmcore_suggests_can_be_typed(make_dist, dist: str) -> None:
    module = "norms_" + dist.replace(" ", "_")
    make_dist(dist, entry_points={"theirs": module}, modules={module: OTHER_RMSNORM})
    registry = Registry()
    with pytest.raises(SpecError, match=r"write one of (.*), or disable one") as info:
        parse_spec("cs336-tiny", registry)
    suggested = re.search(r"write one of (.*), or disable", str(info.value))[1].split(", ")
    assert f'"{dist}":rmsnorm' in suggested and "lmcore-registry:rmsnorm" in suggested
    for name in suggested:  # each one, pasted into a spec, resolves to its provider
        spec = parse_spec(f"cs336-tiny, norm={name}", registry)
        assert parse_spec(str(spec), registry) == spec
    spec = parse_spec(f'cs336-tiny, norm="{dist}":rmsnorm', registry)
    assert f',norm="{dist}":rmsnorm,ffn=swiglu,' in str(spec)  # quoted when canonical


def test_disabling_dist_colon_name_skips_only_that_distributions_entry_point(
    make_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dist(
        "other-norms",
        entry_points={"rmsnorm": "other_norms_d"},
        modules={"other_norms_d": OTHER_RMSNORM},
    )
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "rmsnorm")  # the bare name: every provider's
    with pytest.raises(SpecError, match=r"no installed plugin provides norm 'rmsnorm'"):
        parse_spec("cs336-tiny", Registry())
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "Other_Norms:rmsnorm")  # PEP 503 names match
    registry = Registry()
    assert registry.get("norm", "rmsnorm").provenance.dist == "lmcore-registry"
    status = {(r.provenance.dist, r.name): r.status for r in registry.plugins()}
    assert status["other-norms", "rmsnorm"] == "disabled"
    assert status["lmcore-registry", "rmsnorm"] == "ok"
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "other-norm:rmsnorm")
    with pytest.warns(
        LmcoreWarning,
        match=r"LMCORE_DISABLE_PLUGINS names 'other-norm:rmsnorm', but no installed plugin has that entry-point name \(did you mean 'other-norms:rmsnorm'\?\)",
    ):
        Registry().load()


@pytest.mark.parametrize(
    "change, what",
    [
        (
            "torch.set_default_dtype(torch.float64)",
            r"default dtype from torch.float32 to torch.float64",
        ),
        (
            "torch.set_grad_enabled(False)",
            r"grad mode \(torch.is_grad_enabled\(\)\) from True to False",
        ),
    ],
    ids=["dtype", "grad"],
)
def test_a_plugin_changing_torchs_defaults_is_failed_and_undone(
    make_dist, change: str, what: str, request
) -> None:
    module = "quiet_" + request.node.callspec.id
    source = f"import torch\n{change}\nfrom lmcore import hookimpl\n@hookimpl\ndef lmcore_components():\n    return []\n"
    make_dist("lmcore-quiet", entry_points={"quiet": module}, modules={module: source})
    registry = Registry()
    [record] = [r for r in registry.plugins() if r.name == "quiet"]
    assert record.status == "failed" and re.search(what, record.reason), record.reason
    assert "The change was undone and the plugin not loaded" in record.reason
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    with use_registry(registry):
        assert build_model("cs336-tiny").lm_head.weight.dtype == torch.float32


def test_a_plugin_that_declares_nothing_is_listed(make_dist, registry: Registry, capsys) -> None:
    source = "from lmcore import hookimpl\n@hookimpl\ndef lmcore_components():\n    return []\n"
    make_dist("lmcore-empty", entry_points={"empty": "empty_mod"}, modules={"empty_mod": source})
    assert main(["plugins"]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if " empty " in f" {line} "]
    assert row.split()[:5] == ["-", "empty", "lmcore-empty", "1.0", "empty"]
    assert row.endswith("loaded, but declares no components or presets")


def test_a_slow_plugin_import_is_named_while_it_runs(
    make_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lmcore.registry.loading

    monkeypatch.setattr(lmcore.registry.loading, "SLOW_IMPORT_SECONDS", 0.05)  # where it is read
    make_dist(
        "lmcore-sleepy",
        entry_points={"sleepy": "sleepy_mod"},
        modules={"sleepy_mod": "import time\ntime.sleep(0.5)\n"},
    )
    registry = Registry()
    with pytest.warns(
        SlowPluginWarning,
        match=r"plugin 'sleepy' of lmcore-sleepy 1.0 \(module sleepy_mod\) has been importing for 0.05 s; lmcore waits for it. Skip it with LMCORE_DISABLE_PLUGINS=lmcore-sleepy:sleepy",
    ):
        registry.load()
    assert any(
        re.fullmatch(
            r"plugin 'sleepy' of lmcore-sleepy 1.0 took 0.\d s to import; skip it with LMCORE_DISABLE_PLUGINS=lmcore-sleepy:sleepy",
            p,
        )
        for p in registry.problems
    ), registry.problems
