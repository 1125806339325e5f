"""Loading a registry's plugins: never at import, once on first use (threads wait for it, a fork
waits until it is done), strict mode, disabling by name or dist:name, autoload off, and
plugins registered in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest
import torch

from lmcore import (
    Component,
    ComponentNotFoundError,
    PluginLoadError,
    Registry,
    SpecError,
    parse_spec,
)
from lmcore.errors import LmcoreWarning, PluginNameError
from lmcore.registry.loading import Plugins
from tests.helpers.errors import raises_naming, warns_naming
from tests.helpers.plugins import BROKEN_IMPORT, OTHER_RMSNORM, scale_norm


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
    with raises_naming(
        ComponentNotFoundError,
        "entry points are not loaded",
        "(LMCORE_DISABLE_PLUGIN_AUTOLOAD is set)",
    ):
        reg.get("norm", "rmsnorm")


def test_strict_mode_turns_a_failure_into_an_immediate_error(
    make_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_dist(
        "lmcore-flash",
        entry_points={"flash": "flash_broken3"},
        modules={"flash_broken3": BROKEN_IMPORT},
    )
    facts = (
        "plugin 'flash' from lmcore-flash 1.0",
        "failed",
        "importing 'flash_broken3' raised ImportError: flash kernels need triton",
    )
    with raises_naming(PluginLoadError, *facts):
        Registry(strict=True).load()
    strict = Registry(strict=True)
    for _ in range(2):  # nothing half-loaded survives a strict failure: it raises every time
        with raises_naming(PluginLoadError, *facts):
            strict.get("norm", "rmsnorm")
    monkeypatch.setenv("LMCORE_STRICT_PLUGINS", "1")
    with raises_naming(PluginLoadError, *facts):
        Registry().load()
    assert Registry(strict=False).get("norm", "rmsnorm")  # the keyword wins over the variable


def test_a_malformed_flag_value_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCORE_STRICT_PLUGINS", "maybe")
    with raises_naming(
        ValueError, "LMCORE_STRICT_PLUGINS='maybe' is not a flag", "use 1/true/yes or 0/false/no"
    ):
        Registry().load()


def test_disabled_builtin_is_not_loaded_and_errors_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "rope, sdpa")
    reg = Registry()
    status = {r.name: r.status for r in reg.plugins()}
    assert status["rope"] == "disabled" and status["sdpa"] == "disabled" and status["nope"] == "ok"
    with raises_naming(
        SpecError,
        "no installed plugin provides pos 'rope'",
        "available pos: alibi, learned, nope, sinusoidal",
        "disabled plugins, not loaded (LMCORE_DISABLE_PLUGINS): 'rope' (lmcore-registry ",
        re.compile(r"\), 'sdpa'"),
    ):
        parse_spec("cs336-tiny, attn=sdpa", reg)


def test_registry_keyword_disables_too() -> None:
    reg = Registry(disabled=["rope"])
    assert "rope" not in reg.names("pos")


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


def test_disabling_an_unknown_name_warns_with_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMCORE_DISABLE_PLUGINS", "roep")
    reg = Registry()
    with warns_naming(
        LmcoreWarning,
        "LMCORE_DISABLE_PLUGINS names 'roep'",
        "no installed plugin has that entry-point name",
        "(did you mean 'rope'?)",
    ):
        reg.load()
    assert reg.problems and "roep" in reg.problems[0]


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
    with warns_naming(
        LmcoreWarning,
        "LMCORE_DISABLE_PLUGINS names 'other-norm:rmsnorm'",
        "no installed plugin has that entry-point name",
        "(did you mean 'other-norms:rmsnorm'?)",
    ):
        Registry().load()


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


def test_register_and_unregister(registry: Registry) -> None:
    name = registry.add(scale_norm(), name="scaler")
    prov = registry.get("norm", "scale").provenance
    assert name == "scaler" and prov.plugin == "scaler"
    assert prov.module == "tests.helpers.plugins"  # where the component's factory lives
    with pytest.raises(PluginNameError, match=r"a plugin named 'scaler' is already registered"):
        registry.add(scale_norm(), name="scaler")
    assert issubclass(PluginNameError, ValueError)  # what callers caught before it had a name
    registry.unregister("scaler")
    assert "scale" not in registry.names("norm")
    with pytest.raises(KeyError, match=r"no plugin named 'scaler'"):
        registry.unregister("scaler")
    with pytest.raises(KeyError, match=r"no plugin named 'rmsnrm' \(did you mean 'rmsnorm'\?\)"):
        registry.unregister("rmsnrm")


def test_programmatic_registration_fails_loudly(registry: Registry) -> None:
    bad = Component(kind="norm", name="x", build=torch.nn.Module, features=frozenset({"fast"}))
    with pytest.raises(PluginLoadError, match=r"norm 'x': unknown feature 'fast'"):
        registry.add(bad, name="bad")
    assert "bad" not in {r.name for r in registry.plugins()}


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
