"""The plugins of one registry: loaded from the entry points once, each in isolation, plus the
ones registered in-process.

Loading happens once, under a lock: threads asking at the same time wait for it, and a fork waits
until it is done, so a child never inherits a half-loaded registry. A plugin is attributed every
fault (`lmcore.registry.isolation`); a strict registry raises `PluginLoadError` on the first.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence

import pluggy

import lmcore.hookspecs as hookspecs
from lmcore.components import (
    Component,
    Preset,
    format_qualified,
    validate_component,
    validate_preset,
)
from lmcore.errors import (
    ConfigError,
    InvalidComponentError,
    LmcoreWarning,
    PluginLoadError,
    PluginNameError,
    PluginNotFoundError,
    describe_exception,
    did_you_mean,
    one_of,
)
from lmcore.registry.discovery import (
    discover,
    guard_torch_import,
    qualified_key,
    unknown_disabled,
)
from lmcore.registry.isolation import (
    call_hook,
    check_unique,
    interrupts_noted,
    restore_torch_state,
    torch_state,
    warn_slow,
)
from lmcore.registry.records import PluginRecord, Provenance

# A plugin still importing after this many seconds is named in a `SlowPluginWarning`.
SLOW_IMPORT_SECONDS = 2.0

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _env_flag(var: str) -> bool:
    raw = os.environ.get(var, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigError(f"{var}={os.environ[var]!r} is not a flag; use 1/true/yes or 0/false/no")


def _env_list(var: str) -> set[str]:
    return {p.strip() for p in os.environ.get(var, "").split(",") if p.strip()}


class _ItemsPlugin:
    """Wraps components and presets handed to `Registry.add` so they go through the hooks."""

    def __init__(self, items: Sequence[Component | Preset]):
        self._items = tuple(items)

    @hookspecs.hookimpl
    def lmcore_components(self) -> list[Component]:
        return [i for i in self._items if isinstance(i, Component)]

    @hookspecs.hookimpl
    def lmcore_presets(self) -> list[Preset]:
        return [i for i in self._items if isinstance(i, Preset)]


class Plugins:
    """A registry's plugins by name, with their records; see `lmcore.registry.Registry` for the
    options. `Registry.load` loads them before any other use."""

    def __init__(
        self, *, autoload: bool | None, disabled: Iterable[str], strict: bool | None, group: str
    ):
        self._autoload = autoload
        self._disabled = set(disabled)
        self._strict = strict
        self.group = group
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._records: dict[str, PluginRecord] = {}
        self.loaded = False
        self.loading: int | None = None  # the thread loading, while it does
        self.lock = threading.RLock()
        self._counter = 0
        self.problems: list[str] = []  # what is not a plugin failure (a disabled name unknown)
        _LOADERS.add(self)

    @property
    def strict(self) -> bool:
        return self._strict if self._strict is not None else _env_flag("LMCORE_STRICT_PLUGINS")

    @property
    def autoload(self) -> bool:
        if self._autoload is not None:
            return self._autoload
        return not _env_flag("LMCORE_DISABLE_PLUGIN_AUTOLOAD")

    @property
    def disabled(self) -> set[str]:
        return self._disabled | _env_list("LMCORE_DISABLE_PLUGINS")

    def records(self) -> list[PluginRecord]:
        with self.lock:  # a consistent copy, even while another thread registers
            return list(self._records.values())

    # ---------------------------------------------------------------- loading

    def load(self) -> None:
        """Scan entry points once; later calls do nothing. Thread-safe: concurrent callers wait
        for the one that loads; a plugin that asks while it is imported sees what is loaded."""
        if self.loaded:
            return
        with self.lock:
            if self.loaded or self.loading == threading.get_ident():
                return
            if self.autoload:  # reading the variables first: a bad value raises every time
                strict, disabled = self.strict, self.disabled
                self.loading = threading.get_ident()
                try:
                    self._load_entry_points(strict, disabled)
                except BaseException:
                    # A strict failure (or Ctrl-C) leaves nothing half-loaded: the next call
                    # starts over.
                    self._reset()
                    raise
                finally:
                    self.loading = None
            self.loaded = True

    def _reset(self) -> None:
        for record in self._records.values():
            if record.plugin is not None and self._pm.is_registered(record.plugin):
                self._pm.unregister(record.plugin)
        self._records.clear()
        self.problems.clear()
        self.loaded = False

    def _load_entry_points(self, strict: bool, disabled: set[str]) -> None:
        self.problems += guard_torch_import()
        import torch  # noqa: F401  (now: its import time must not count against a plugin)

        names = {d for d in disabled if ":" not in d}
        qualified = {qualified_key(*d.rsplit(":", 1)) for d in disabled if ":" in d}
        seen: set[tuple[str, str]] = set()  # (normalised distribution, entry-point name)
        with interrupts_noted() as interrupt:
            for found in discover(self.group):
                prov = found.provenance
                pair = qualified_key(prov.qualifier, prov.plugin)
                seen.add(pair)
                key = self._key(prov)
                if isinstance(found.source, str):
                    self._fail(key, prov, found.source, None, strict)
                elif prov.plugin in names or pair in qualified:
                    self._records[key] = PluginRecord(
                        prov,
                        "disabled",
                        "disabled by LMCORE_DISABLE_PLUGINS or Registry(disabled=...)",
                    )
                else:
                    self._import(key, prov, found.source, strict, interrupt)
        for message in unknown_disabled(names, qualified, seen):
            self.problems.append(message)
            # Named at the frame that called `Registry.load` (or the registry method that did).
            warnings.warn(message, LmcoreWarning, stacklevel=4)

    def _import(
        self,
        key: str,
        prov: Provenance,
        ep: md.EntryPoint,
        strict: bool,
        interrupt: dict[str, bool],
    ) -> None:
        """Import one entry point and register what its hooks declare, blaming it for faults."""
        slow = threading.Timer(SLOW_IMPORT_SECONDS, warn_slow, (prov, SLOW_IMPORT_SECONDS))
        slow.daemon = True
        before = torch_state()
        start = time.perf_counter()
        slow.start()
        try:
            plugin = ep.load()
        except BaseException as e:  # one broken plugin must not take the rest down
            if isinstance(e, KeyboardInterrupt) and interrupt["signalled"]:
                raise  # the user's Ctrl-C, not the plugin's
            self._fail(
                key, prov, f"importing {ep.value!r} raised {describe_exception(e)}", e, strict
            )
            return
        finally:
            slow.cancel()
            seconds = time.perf_counter() - start
            if seconds >= SLOW_IMPORT_SECONDS:
                self.problems.append(
                    f"plugin {prov.plugin!r} of {prov.dist} {prov.version} took {seconds:.1f} s "
                    f"to import; skip it with LMCORE_DISABLE_PLUGINS="
                    f"{format_qualified(prov.qualifier, prov.plugin)}"
                )
        changed = restore_torch_state(before)
        if changed:
            self._fail(key, prov, f"importing {ep.value!r} {changed}", None, strict)
            return
        self._add(key, plugin, prov, strict, interrupt)
        self._records[key].seconds = seconds

    # ---------------------------------------------------------------- in-process plugins

    def register(self, plugin: object, name: str | None, module: str) -> str:
        """Register `plugin` under `name` (default: the next ``added-N``); errors raise at once."""
        with self.lock:
            name = name or f"added-{self._counter}"
            self._counter += 1
            if name in self._records:
                raise PluginNameError(
                    f"a plugin named {name!r} is already registered "
                    f"({self._records[name].provenance}); "
                    "pick another name or unregister it first"
                )
            prov = Provenance(plugin=name, module=module)
            try:
                self._add(name, plugin, prov, strict=True)
            except PluginLoadError:
                del self._records[name]  # nothing half-registered is left behind
                raise
            return name

    def add(self, items: Sequence[Component | Preset], name: str | None, module: str) -> str:
        return self.register(_ItemsPlugin(items), name, module)

    def unregister(self, name: str) -> None:
        with self.lock:
            record = self._records.pop(name, None)
            if record is None:
                raise PluginNotFoundError(
                    f"no plugin named {name!r}{did_you_mean(name, self._records)}; "
                    f"plugins: {one_of(self._records)}"
                )
            if record.plugin is not None and self._pm.is_registered(record.plugin):
                self._pm.unregister(record.plugin)

    # ---------------------------------------------------------------- one plugin

    def _key(self, prov: Provenance) -> str:
        # Two distributions may use the same entry-point name; keep both records.
        return (
            prov.plugin if prov.plugin not in self._records else f"{prov.qualifier}:{prov.plugin}"
        )

    def _fail(
        self, key: str, prov: Provenance, reason: str, exc: BaseException | None, strict: bool
    ) -> None:
        self._records[key] = PluginRecord(prov, "failed", reason)
        if strict:
            raise PluginLoadError(f"plugin {prov.plugin!r} from {prov} failed: {reason}") from exc

    def _add(
        self,
        key: str,
        plugin: object,
        prov: Provenance,
        strict: bool,
        interrupt: dict[str, bool] | None = None,
    ) -> None:
        """Register `plugin` and record what its hooks declare. `interrupt` (from loading) tells
        a plugin's KeyboardInterrupt from the user's; without it, one is passed on."""
        try:
            self._pm.register(plugin, name=key)
            self._pm.check_pending()
        except Exception as e:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            self._fail(key, prov, f"registering it raised {describe_exception(e)}", e, strict)
            return
        before = torch_state()
        try:
            components = tuple(
                validate_component(c) for c in call_hook(self._pm, plugin, "lmcore_components")
            )
            presets = tuple(
                validate_preset(p) for p in call_hook(self._pm, plugin, "lmcore_presets")
            )
            check_unique(components, presets)
            changed = restore_torch_state(before)
            if changed:
                raise InvalidComponentError(f"its hooks {changed}")
        except BaseException as e:
            restore_torch_state(before)
            self._pm.unregister(plugin)
            cause = e.__cause__ if isinstance(e, InvalidComponentError) else e
            if isinstance(cause, KeyboardInterrupt) and (
                interrupt is None or interrupt["signalled"]
            ):
                raise cause from None  # the user's Ctrl-C, not the plugin's
            if not isinstance(e, Exception | SystemExit | KeyboardInterrupt):
                raise
            reason = str(e) if isinstance(e, InvalidComponentError) else describe_exception(e)
            self._fail(key, prov, reason, e, strict)
            return
        self._records[key] = PluginRecord(prov, "ok", "", components, presets, plugin)


# A fork waits for any registry being loaded, so a child never inherits a half-loaded one (or
# a lock held by a thread it does not have): the logging module does the same with its locks.
_LOADERS: weakref.WeakSet[Plugins] = weakref.WeakSet()


def _before_fork() -> None:
    for plugins in list(_LOADERS):
        plugins.lock.acquire()


def _after_fork() -> None:
    for plugins in list(_LOADERS):
        with contextlib.suppress(RuntimeError):
            plugins.lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )
