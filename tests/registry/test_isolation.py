"""A plugin that fails (at import, in its hook, with a malformed or duplicate declaration, by
changing torch's defaults, by exiting or by a KeyboardInterrupt) is recorded as failed with its
reason, and everything else keeps working; a slow import is named while it runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from lmcore import (
    PluginFailedError,
    Registry,
    SpecError,
    build_model,
    parse_spec,
    use_registry,
)
from lmcore.errors import SlowPluginWarning
from tests.helpers.errors import assert_naming, raises_naming, warns_naming
from tests.helpers.plugins import BROKEN_IMPORT, plugin_source

Module = torch.nn.Module


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
    with raises_naming(
        PluginFailedError,
        "attn 'flash' would come from plugin 'flash' of lmcore-flash 0.3",
        "which failed to load",
        "importing 'flash_broken' raised ImportError: flash kernels need triton",
    ):
        registry.get("attn", "flash")
    with raises_naming(
        SpecError, "which failed to load", "importing 'flash_broken' raised ImportError"
    ):
        parse_spec("tinystories, attn=flash")


@pytest.mark.parametrize(
    "body, facts",
    [
        (
            """
            @hookimpl
            def lmcore_components():
                raise RuntimeError("boom")
            """,
            (
                "hook lmcore_components() raised RuntimeError: boom",
                re.compile(r"at .*bad_mod\w*\.py:\d+"),
            ),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [42]
            """,
            ("lmcore_components() must return lmcore.Component objects, got int",),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return Component(kind="norm", name="x", build=Module)
            """,
            ("hook lmcore_components() must return a list, got Component",),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="nrom", name="x", build=Module)]
            """,
            (
                "component 'x' has kind 'nrom'",
                "kinds are adapter, attn, block, ffn, mixer, norm, optimizer, parametrization, pos, quant, schedule",
                "(did you mean 'norm'?)",
            ),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x y", build=Module)]
            """,
            ("norm component name 'x y' is not a valid name",),
        ),
        (
            """
            def build(d_model): ...
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=build, args=(Arg("eps", float, 1e-5),))]
            """,
            ("norm 'x'", "build 'build' does not accept declared argument(s) eps"),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=Module, args=(Arg("eps", float, "small"),))]
            """,
            (
                "norm 'x'",
                "default of argument 'eps' is invalid",
                "it expects float, got str 'small'",
            ),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="attn", name="x", build=Module, features=frozenset({"gqa", "flash"}))]
            """,
            (
                "attn 'x'",
                "unknown feature 'flash'",
                "attn features are bias, compile, documents, gqa, mask, nocache",
            ),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=Module, activations=4096)]
            """,
            ("norm 'x'", "activations must be callable or None"),
        ),
        (
            """
            def build(d_model, batch=1): ...
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=build, args=(Arg("batch", int, 1),))]
            """,
            (
                "norm 'x'",
                "argument 'batch' clashes with a name lmcore passes itself",
                re.compile(r"itself \(.*batch.*\)"),
            ),
        ),
        (
            """
            @hookimpl
            def lmcore_components():
                return [Component(kind="norm", name="x", build=Module)] * 2
            """,
            ("norm 'x' is declared twice by this plugin",),
        ),
        (
            """
            @hookimpl
            def lmcore_component():
                return []
            """,
            ("registering it raised PluginValidationError", "unknown hook 'lmcore_component'"),
        ),
        (
            """
            @hookimpl
            def lmcore_components(d_model):
                return []
            """,
            (
                "registering it raised PluginValidationError",
                re.compile(r"PluginValidationError: .*d_model"),
            ),
        ),
        (
            """
            @hookimpl
            def lmcore_presets():
                return [Preset("my preset", "d_model=1")]
            """,
            ("preset name 'my preset' is not a valid name",),
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
    make_dist, body: str, facts: tuple[str | re.Pattern[str], ...], request
) -> None:
    mod = "bad_mod_" + request.node.callspec.id.replace("-", "_")
    make_dist("lmcore-bad", entry_points={"bad": mod}, modules={mod: plugin_source(body)})
    reg = Registry()
    [record] = [r for r in reg.plugins() if r.name == "bad"]
    assert record.status == "failed"
    assert_naming(record.reason, *facts)
    assert reg.get("norm", "rmsnorm").provenance.dist == "lmcore-registry"  # the rest still loads
    # A failed plugin leaves nothing registered behind.
    assert all(e.provenance.plugin != "bad" for e in reg.entries())


def test_an_argument_name_that_is_not_a_string_is_named(make_dist, registry: Registry) -> None:
    body = """
        @hookimpl
        def lmcore_components():
            return [Component(kind="norm", name="odd", build=Module, args=(Arg(name=5, type=int, default=1),))]
    """
    make_dist(
        "lmcore-argname",
        entry_points={"argname": "argname_mod"},
        modules={"argname_mod": plugin_source(body)},
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
        "lmcore-twice",
        entry_points={"twice": "twice_mod"},
        modules={"twice_mod": plugin_source(body)},
    )
    [record] = [r for r in registry.plugins() if r.name == "twice"]
    assert (record.status, record.reason) == (
        "failed",
        "preset 'twice' is declared twice by this plugin",
    )
    assert "once" not in registry.preset_names()  # none of the plugin's presets is kept


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
    with warns_naming(
        SlowPluginWarning,
        "plugin 'sleepy' of lmcore-sleepy 1.0 (module sleepy_mod)",
        "has been importing for 0.05 s",
        "lmcore waits for it",
        "Skip it with LMCORE_DISABLE_PLUGINS=lmcore-sleepy:sleepy",
    ):
        registry.load()
    assert any(
        re.fullmatch(
            r"plugin 'sleepy' of lmcore-sleepy 1.0 took 0.\d s to import; skip it with LMCORE_DISABLE_PLUGINS=lmcore-sleepy:sleepy",
            p,
        )
        for p in registry.problems
    ), registry.problems


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
