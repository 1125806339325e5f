"""Plugin discovery and component lookup.

The registry finds plugins through the entry-point group ``lmcore`` the first time it is asked for
something (never at import), loads each one in isolation, and indexes the components and presets
their hooks return. A plugin that fails to import, whose hook raises, or whose hook returns a
malformed declaration is recorded as failed with its reason; everything else keeps working.

Environment:
  LMCORE_DISABLE_PLUGINS=a,b          entry-point names not to load
  LMCORE_DISABLE_PLUGIN_AUTOLOAD=1    load no entry points; only programmatic registrations
  LMCORE_STRICT_PLUGINS=1             any plugin failure raises `PluginLoadError` at once
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata as md
import os
import re
import traceback
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pluggy

from lmcore import hookspecs
from lmcore.components import (
    Component,
    Preset,
    validate_component,
    validate_preset,
)
from lmcore.errors import (
    AmbiguousComponentError,
    ComponentNotFoundError,
    ConfigError,
    InvalidComponentError,
    LmcoreWarning,
    PluginFailedError,
    PluginLoadError,
    PluginNotFoundError,
    did_you_mean,
    one_of,
)

GROUP = "lmcore"
PluginStatus = Literal["ok", "failed", "disabled"]
ComponentStatus = Literal["ok", "shadowed"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def normalize_dist(name: str) -> str:
    """PEP 503 normalisation, so `lmcore_flash`, `LMCore-Flash` and `lmcore-flash` are one name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Provenance:
    """Where a component or preset came from."""

    plugin: str  # entry-point name, or the name given to `Registry.register`
    module: str
    dist: str | None = None  # distribution name; None for programmatic registrations
    version: str | None = None

    @property
    def qualifier(self) -> str:
        """What goes before the colon in `dist:name` to pick this provider."""
        return self.dist if self.dist is not None else self.plugin

    def __str__(self) -> str:
        where = f"{self.dist} {self.version}" if self.dist else "registered in-process"
        return f"{where} (plugin {self.plugin!r}, module {self.module})"


@dataclass(frozen=True)
class Entry:
    """A component together with where it came from."""

    component: Component
    provenance: Provenance
    status: ComponentStatus = "ok"

    @property
    def kind(self) -> str:
        return self.component.kind

    @property
    def name(self) -> str:
        return self.component.name


@dataclass(frozen=True)
class PresetEntry:
    preset: Preset
    provenance: Provenance
    status: ComponentStatus = "ok"

    @property
    def name(self) -> str:
        return self.preset.name


@dataclass
class PluginRecord:
    """One plugin: its provenance, status and, when it failed or is disabled, why."""

    provenance: Provenance
    status: PluginStatus
    reason: str = ""
    components: tuple[Component, ...] = ()
    presets: tuple[Preset, ...] = ()
    plugin: object | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.provenance.plugin


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


class Registry:
    """Components and presets by kind and name, loaded from entry points on first use.

    Args:
        autoload: load entry points; default: not ``LMCORE_DISABLE_PLUGIN_AUTOLOAD``.
        disabled: entry-point names to skip, added to ``LMCORE_DISABLE_PLUGINS``.
        strict: raise on the first plugin failure; default: ``LMCORE_STRICT_PLUGINS``.
        group: the entry-point group to scan.
    """

    def __init__(
        self,
        *,
        autoload: bool | None = None,
        disabled: Iterable[str] = (),
        strict: bool | None = None,
        group: str = GROUP,
    ):
        self._autoload = autoload
        self._disabled = set(disabled)
        self._strict = strict
        self.group = group
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._records: dict[str, PluginRecord] = {}
        self._loaded = False
        self._counter = 0
        #: Problems that are not plugin failures (e.g. a disabled name no plugin has).
        self.problems: list[str] = []

    # ---------------------------------------------------------------- options

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

    # ---------------------------------------------------------------- loading

    def load(self) -> Registry:
        """Scan entry points once; later calls do nothing. Returns self."""
        if self._loaded:
            return self
        self._loaded = True
        if not self.autoload:
            return self
        try:
            self._load_entry_points(self.strict, self.disabled)
        except BaseException:
            # A strict failure (or Ctrl-C) leaves nothing half-loaded: the next call starts over.
            for record in self._records.values():
                if record.plugin is not None and self._pm.is_registered(record.plugin):
                    self._pm.unregister(record.plugin)
            self._records.clear()
            self.problems.clear()
            self._loaded = False
            raise
        return self

    def _load_entry_points(self, strict: bool, disabled: set[str]) -> None:
        seen_names: set[str] = set()
        eps = sorted(md.entry_points(group=self.group), key=lambda e: (_ep_dist(e)[0], e.name))
        for ep in eps:
            dist, version = _ep_dist(ep)
            seen_names.add(ep.name)
            prov = Provenance(plugin=ep.name, module=ep.value, dist=dist, version=version)
            key = self._key(prov)
            if ep.name in disabled:
                self._records[key] = PluginRecord(
                    prov, "disabled", "disabled by LMCORE_DISABLE_PLUGINS or Registry(disabled=...)"
                )
                continue
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as e:  # one broken plugin must not take the rest down
                self._fail(key, prov, f"importing {ep.value!r} raised {_exc(e)}", e, strict)
                continue
            self._add(key, plugin, prov, strict)
        for name in sorted(disabled - seen_names):
            msg = (
                f"LMCORE_DISABLE_PLUGINS names {name!r}, but no installed plugin has that "
                f"entry-point name{did_you_mean(name, seen_names)}; "
                f"entry-point names: {one_of(seen_names)}"
            )
            self.problems.append(msg)
            warnings.warn(msg, LmcoreWarning, stacklevel=3)

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a module or object implementing the hooks; returns its plugin name.

        Errors raise at once (no isolation): the caller is the one who can fix them.
        """
        module = getattr(plugin, "__module__", None) or getattr(plugin, "__name__", "?")
        return self._register(plugin, name or getattr(plugin, "__name__", None), str(module))

    def add(self, *items: Component | Preset, name: str | None = None) -> str:
        """Register components and presets directly (notebooks, tests); returns the plugin name."""
        # Provenance names where the first component's factory lives, not this module.
        builds = [i.build for i in items if isinstance(i, Component)]
        module = getattr(builds[0], "__module__", None) if builds else None
        return self._register(_ItemsPlugin(items), name, module or "__main__")

    def _register(self, plugin: object, name: str | None, module: str) -> str:
        self.load()
        name = name or f"added-{self._counter}"
        self._counter += 1
        if name in self._records:
            raise ValueError(
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

    def unregister(self, name: str) -> None:
        """Remove a plugin (programmatic or loaded) and everything it provided."""
        self.load()
        record = self._records.pop(name, None)
        if record is None:
            raise PluginNotFoundError(
                f"no plugin named {name!r}{did_you_mean(name, self._records)}; "
                f"plugins: {one_of(self._records)}"
            )
        if record.plugin is not None and self._pm.is_registered(record.plugin):
            self._pm.unregister(record.plugin)

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

    def _add(self, key: str, plugin: object, prov: Provenance, strict: bool) -> None:
        try:
            self._pm.register(plugin, name=key)
            self._pm.check_pending()
        except Exception as e:
            if self._pm.is_registered(plugin):
                self._pm.unregister(plugin)
            self._fail(key, prov, f"registering it raised {_exc(e)}", e, strict)
            return
        try:
            components = tuple(
                validate_component(c) for c in self._call(plugin, "lmcore_components")
            )
            presets = tuple(validate_preset(p) for p in self._call(plugin, "lmcore_presets"))
            _check_unique(components, presets)
        except Exception as e:
            self._pm.unregister(plugin)
            self._fail(key, prov, _exc(e), e, strict)
            return
        self._records[key] = PluginRecord(prov, "ok", "", components, presets, plugin)

    def _call(self, plugin: object, hook: str) -> list[Any]:
        """Call one plugin's implementation of `hook`, so a failure is pinned on that plugin."""
        out: list[Any] = []
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
            if impl.plugin is not plugin:
                continue
            try:
                result = impl.function()
            except (Exception, SystemExit) as e:
                raise InvalidComponentError(f"hook {hook}() raised {_exc(e)}") from e
            if result is None:
                continue
            if isinstance(result, Component | Preset) or not isinstance(result, Sequence):
                raise InvalidComponentError(
                    f"hook {hook}() must return a list, got {type(result).__name__}"
                )
            out.extend(result)
        return out

    # ---------------------------------------------------------------- queries

    def plugins(self) -> list[PluginRecord]:
        """Every plugin the registry saw: ok, failed or disabled."""
        self.load()
        return list(self._records.values())

    def entries(self, kind: str | None = None) -> list[Entry]:
        """Every component, with provenance and status (`shadowed` when another has its name)."""
        self.load()
        found = [
            (c, r.provenance)
            for r in self._records.values()
            if r.status == "ok"
            for c in r.components
            if kind is None or c.kind == kind
        ]
        counts: dict[tuple[str, str], int] = {}
        for c, _ in found:
            counts[c.kind, c.name] = counts.get((c.kind, c.name), 0) + 1
        return [Entry(c, p, "shadowed" if counts[c.kind, c.name] > 1 else "ok") for c, p in found]

    def preset_entries(self) -> list[PresetEntry]:
        self.load()
        found = [
            (p, r.provenance) for r in self._records.values() if r.status == "ok" for p in r.presets
        ]
        counts: dict[str, int] = {}
        for p, _ in found:
            counts[p.name] = counts.get(p.name, 0) + 1
        return [PresetEntry(p, v, "shadowed" if counts[p.name] > 1 else "ok") for p, v in found]

    def names(self, kind: str) -> list[str]:
        return sorted({e.name for e in self.entries(kind)})

    def preset_names(self) -> list[str]:
        return sorted({e.name for e in self.preset_entries()})

    def is_ambiguous(self, kind: str, name: str) -> bool:
        return sum(1 for e in self.entries(kind) if e.name == name) > 1

    def get(self, kind: str, name: str, provider: str | None = None) -> Entry:
        """The one component of `kind` called `name` (from `provider`, a `dist:` qualifier)."""
        matches = [e for e in self.entries(kind) if e.name == name]
        entry: Entry = self._choose(kind, name, provider, matches, self.names(kind))
        return entry

    def get_preset(self, name: str, provider: str | None = None) -> PresetEntry:
        matches = [e for e in self.preset_entries() if e.name == name]
        entry: PresetEntry = self._choose("preset", name, provider, matches, self.preset_names())
        return entry

    def _choose(
        self,
        kind: str,
        name: str,
        provider: str | None,
        matches: Sequence[Any],
        available: Sequence[str],
    ) -> Any:
        if provider is not None:
            want = normalize_dist(provider)
            picked = [m for m in matches if normalize_dist(m.provenance.qualifier) == want]
            if len(picked) == 1:
                return picked[0]
            if not picked:
                offered = [m.provenance.qualifier for m in matches]
                if offered:
                    raise ComponentNotFoundError(
                        f"{provider!r} does not provide {kind} {name!r}"
                        f"{did_you_mean(provider, offered)}; it is provided by {one_of(offered)}"
                    )
                # fall through: nobody provides the name at all
            else:
                raise AmbiguousComponentError(
                    f"{kind} {name!r} is provided more than once by {provider!r}: "
                    + "; ".join(str(m.provenance) for m in picked)
                )
        if len(matches) == 1 and provider is None:
            return matches[0]
        if len(matches) > 1:
            choices = ", ".join(f"{m.provenance.qualifier}:{name}" for m in matches)
            raise AmbiguousComponentError(
                f"{kind} {name!r} is provided by {len(matches)} plugins: "
                + "; ".join(str(m.provenance) for m in matches)
                + f". Neither is chosen for you: write one of {choices}, or disable one with "
                "LMCORE_DISABLE_PLUGINS"
            )
        failed = [r for r in self._records.values() if r.status == "failed"]
        off = [r for r in self._records.values() if r.status == "disabled"]
        for r in failed:
            # A failed plugin's components are unknown; its entry-point name is the best clue.
            if r.name == name:
                raise PluginFailedError(
                    f"{kind} {name!r} would come from plugin {r.name!r} of {r.provenance}, "
                    f"which failed to load: {r.reason}"
                )
        # Only suggest a near name when no disabled plugin is the likelier answer.
        hint = "" if any(r.name == name for r in off) else did_you_mean(name, available)
        message = (
            f"no installed plugin provides {kind} {name!r}{hint}; "
            f"available {kind}: {one_of(available)}"
        )
        if failed:
            message += "; plugins that failed to load: " + "; ".join(
                f"{r.name!r} ({r.provenance}): {r.reason}" for r in failed
            )
        if off:
            message += "; disabled plugins, not loaded (LMCORE_DISABLE_PLUGINS): " + ", ".join(
                f"{r.name!r} ({r.provenance.dist} {r.provenance.version})" for r in off
            )
        if not self.autoload:
            message += "; entry points are not loaded (LMCORE_DISABLE_PLUGIN_AUTOLOAD is set)"
        raise ComponentNotFoundError(message)


def _ep_dist(ep: md.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("?", "?")
    return (dist.metadata["Name"] or "?", dist.version or "?")


def _exc(e: BaseException) -> str:
    """`Type: message` plus the innermost frame, so a failure can be traced to a line."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {message}{where}"


def _check_unique(components: Sequence[Component], presets: Sequence[Preset]) -> None:
    seen: set[tuple[str, str]] = set()
    for c in components:
        if (c.kind, c.name) in seen:
            raise InvalidComponentError(f"{c.kind} {c.name!r} is declared twice by this plugin")
        seen.add((c.kind, c.name))
    names = [p.name for p in presets]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise InvalidComponentError(f"preset {sorted(dupes)[0]!r} is declared twice by this plugin")


# -------------------------------------------------------------------- the current registry

_default: Registry | None = None
_current: contextvars.ContextVar[Registry | None] = contextvars.ContextVar(
    "lmcore_registry", default=None
)


def get_registry() -> Registry:
    """The registry in use: the innermost `use_registry` block's, else the process default."""
    current = _current.get()
    if current is not None:
        return current
    global _default
    if _default is None:
        _default = Registry()
    return _default


@contextlib.contextmanager
def use_registry(registry: Registry) -> Iterator[Registry]:
    """Make `registry` the one `build_model`, `parse_spec` and the CLI use inside the block."""
    token = _current.set(registry)
    try:
        yield registry
    finally:
        _current.reset(token)


@contextlib.contextmanager
def scoped_registry(**options: Any) -> Iterator[Registry]:
    """A fresh `Registry(**options)` in use for the block; its registrations vanish on exit."""
    with use_registry(Registry(**options)) as registry:
        yield registry
