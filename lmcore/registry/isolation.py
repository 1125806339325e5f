"""What a plugin may not do while it loads, and how each fault is pinned on it: raising (a
KeyboardInterrupt included, unless the user pressed Ctrl-C), changing torch's global defaults,
importing slowly, or declaring malformed or duplicate components."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import pluggy

from lmcore.components import Component, Preset, format_qualified
from lmcore.errors import InvalidComponentError, SlowPluginWarning, describe_exception
from lmcore.registry.records import Provenance


@contextlib.contextmanager
def interrupts_noted() -> Iterator[dict[str, bool]]:
    """While loading, a real Ctrl-C is noted (``signalled``) before it raises, so that a
    KeyboardInterrupt a plugin raises itself can be isolated like any other failure.

    Signals reach only the main thread, so in any other thread every KeyboardInterrupt is
    raised by code. Where no handler can be installed, every one counts as the user's.
    """
    state = {"signalled": False}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:  # Ctrl-C is ignored here: any KeyboardInterrupt is code's
        yield state
        return

    def noted(signum: int, frame: Any) -> None:
        state["signalled"] = True
        if callable(previous):  # Python's own handler raises KeyboardInterrupt
            previous(signum, frame)
        else:  # SIG_DFL, or a handler set outside Python
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, noted)
    except (ValueError, OSError):  # what signal.signal raises where it cannot install one
        yield {"signalled": True}
        return
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def torch_state() -> tuple[Any, ...] | None:
    """torch's process-wide defaults that a plugin could change behind every build."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled()


def restore_torch_state(before: tuple[Any, ...] | None) -> str:
    """Undo a change of torch's defaults since `before`; say what changed ('' when nothing)."""
    after = torch_state()
    if after is None:
        return ""
    import torch

    if before is None:  # torch was imported since: compare with its defaults
        before = (torch.float32, torch.device("cpu"), True)
    names = ("default dtype", "default device", "grad mode (torch.is_grad_enabled())")
    changed = [
        f"{n} from {b} to {a}" for n, b, a in zip(names, before, after, strict=True) if a != b
    ]
    if not changed:
        return ""
    torch.set_default_dtype(before[0])
    torch.set_default_device(None if before[1] == torch.device("cpu") else before[1])
    torch.set_grad_enabled(before[2])
    return (
        f"changed torch's {', '.join(changed)}; a plugin must leave torch's global defaults "
        "alone (every model lmcore builds would follow them). The change was undone and the "
        "plugin not loaded"
    )


def warn_slow(prov: Provenance, seconds: float) -> None:
    warnings.warn(
        f"plugin {prov.plugin!r} of {prov.dist} {prov.version} (module {prov.module}) has been "
        f"importing for {seconds:g} s; lmcore waits for it. Skip it with "
        f"LMCORE_DISABLE_PLUGINS={format_qualified(prov.qualifier, prov.plugin)}",
        SlowPluginWarning,
        stacklevel=1,
    )


def call_hook(pm: pluggy.PluginManager, plugin: object, hook: str) -> list[Any]:
    """Call one plugin's implementation of `hook`, so a failure is pinned on that plugin."""
    out: list[Any] = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if impl.plugin is not plugin:
            continue
        try:
            result = impl.function()
        except (Exception, SystemExit, KeyboardInterrupt) as e:
            raise InvalidComponentError(f"hook {hook}() raised {describe_exception(e)}") from e
        if result is None:
            continue
        if isinstance(result, Component | Preset) or not isinstance(result, Sequence):
            raise InvalidComponentError(
                f"hook {hook}() must return a list, got {type(result).__name__}"
            )
        out.extend(result)
    return out


def check_unique(components: Sequence[Component], presets: Sequence[Preset]) -> None:
    seen: set[tuple[str, str]] = set()
    for c in components:
        if (c.kind, c.name) in seen:
            raise InvalidComponentError(f"{c.kind} {c.name!r} is declared twice by this plugin")
        seen.add((c.kind, c.name))
    names = [p.name for p in presets]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise InvalidComponentError(f"preset {sorted(dupes)[0]!r} is declared twice by this plugin")
