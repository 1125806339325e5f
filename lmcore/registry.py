"""Plugin discovery and component lookup.

The registry finds plugins through the entry-point group ``lmcore`` the first time it is asked for
something (never at import), loads each one in isolation, and indexes the components and presets
their hooks return. A plugin that fails to import, whose hook raises, or whose hook returns a
malformed declaration is recorded as failed with its reason; everything else keeps working.

Loading happens once per registry, under a lock: threads asking at the same time wait for it,
and a fork waits until it is done, so a child never inherits a half-loaded registry. A plugin
is attributed every fault: one that raises at import or in its hook (KeyboardInterrupt and
SystemExit included, unless the user pressed Ctrl-C), returns malformed declarations, changes
torch's global defaults, or imports slowly (a `SlowPluginWarning` names it). Distribution
metadata that cannot be read only affects that distribution; one without `lmcore` entry points
is never parsed.

Environment:
  LMCORE_DISABLE_PLUGINS=a,dist:b     entry points not to load: a name (from every
                                      distribution) or dist:name (from that one only)
  LMCORE_DISABLE_PLUGIN_AUTOLOAD=1    load no entry points; only programmatic registrations
  LMCORE_STRICT_PLUGINS=1             any plugin failure raises `PluginLoadError` at once
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata as md
import os
import re
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pluggy

import lmcore.hookspecs as hookspecs
from lmcore.components import (
    Component,
    Preset,
    count_or_unknown,
    format_qualified,
    invoke,
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
    SlowPluginWarning,
    clip,
    describe_exception,
    did_you_mean,
    one_of,
)

GROUP = "lmcore"
# A plugin still importing after this many seconds is named in a `SlowPluginWarning`.
SLOW_IMPORT_SECONDS = 2.0
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

    def invoke(
        self, what: str, kwargs: Mapping[str, Any], *, allow: tuple[type[Exception], ...] = ()
    ) -> Any:
        """Call the component's `what` (build, validate, ...); a fault is a `PluginError`
        naming the component and its distribution."""
        return invoke(self.component, what, kwargs, self.provenance, allow=allow)

    def count(self, what: str, kwargs: Mapping[str, Any]) -> int | None:
        """A declared count (params, flops, activations, buffers, default_d_ff, active_params)
        as a checked whole number, or None when the component does not declare `what` (or, for
        activations and buffers, says it is unknown for these arguments)."""
        if getattr(self.component, what) is None:
            return None
        return count_or_unknown(self.component, what, kwargs, self.provenance)


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
    seconds: float = 0.0  # how long importing it took

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
        self._loading: int | None = None  # the thread loading, while it does
        self._lock = threading.RLock()
        self._counter = 0
        #: Problems that are not plugin failures (e.g. a disabled name no plugin has).
        self.problems: list[str] = []
        _REGISTRIES.add(self)

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
        """Scan entry points once; later calls do nothing. Returns self.

        Thread-safe: concurrent callers wait for the one that loads. A plugin that asks the
        registry for something while it is being imported sees what is loaded so far.
        """
        if self._loaded:
            return self
        with self._lock:
            if self._loaded or self._loading == threading.get_ident():
                return self
            if self.autoload:  # reading the variables first: a bad value raises every time
                strict, disabled = self.strict, self.disabled
                self._loading = threading.get_ident()
                try:
                    self._load_entry_points(strict, disabled)
                except BaseException:
                    # A strict failure (or Ctrl-C) leaves nothing half-loaded: the next call
                    # starts over.
                    self._reset()
                    raise
                finally:
                    self._loading = None
            self._loaded = True
        return self

    def _reset(self) -> None:
        for record in self._records.values():
            if record.plugin is not None and self._pm.is_registered(record.plugin):
                self._pm.unregister(record.plugin)
        self._records.clear()
        self.problems.clear()
        self._loaded = False

    def _load_entry_points(self, strict: bool, disabled: set[str]) -> None:
        self.problems += guard_torch_import()
        import torch  # noqa: F401  (now: its import time must not count against a plugin)

        names = {d for d in disabled if ":" not in d}
        qualified = {_qualified_key(*d.rsplit(":", 1)) for d in disabled if ":" in d}
        seen: set[tuple[str, str]] = set()  # (normalised distribution, entry-point name)
        with _interrupts_noted() as interrupt:
            for found in _discover(self.group):
                prov = found.provenance
                seen.add(_qualified_key(prov.qualifier, prov.plugin))
                key = self._key(prov)
                if found.problem is not None:
                    self._fail(key, prov, found.problem, None, strict)
                elif (
                    prov.plugin in names or _qualified_key(prov.qualifier, prov.plugin) in qualified
                ):
                    self._records[key] = PluginRecord(
                        prov,
                        "disabled",
                        "disabled by LMCORE_DISABLE_PLUGINS or Registry(disabled=...)",
                    )
                else:
                    self._import(key, found, strict, interrupt)
        self._warn_unknown(names, qualified, seen)

    def _import(self, key: str, found: _Found, strict: bool, interrupt: dict[str, bool]) -> None:
        """Import one entry point and register what its hooks declare, blaming it for faults."""
        prov, ep = found.provenance, found.entry_point
        assert ep is not None
        slow = threading.Timer(SLOW_IMPORT_SECONDS, _warn_slow, (prov, SLOW_IMPORT_SECONDS))
        slow.daemon = True
        before = _torch_state()
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
        changed = _restore_torch_state(before)
        if changed:
            self._fail(key, prov, f"importing {ep.value!r} {changed}", None, strict)
            return
        self._add(key, plugin, prov, strict, interrupt)
        self._records[key].seconds = seconds

    def _warn_unknown(
        self, names: set[str], qualified: set[tuple[str, str]], seen: set[tuple[str, str]]
    ) -> None:
        """A disabled name that matches no entry point is a warning with a suggestion."""
        seen_names = {name for _, name in seen}
        shown = sorted({f"{d}:{n}" for d, n in seen})
        unknown = [(n, did_you_mean(n, seen_names)) for n in sorted(names - seen_names)]
        unknown += [
            (f"{d}:{n}", did_you_mean(f"{d}:{n}", shown)) for d, n in sorted(qualified - seen)
        ]
        for name, hint in unknown:
            msg = (
                f"LMCORE_DISABLE_PLUGINS names {name!r}, but no installed plugin has that "
                f"entry-point name{hint}; entry-point names: {one_of(seen_names)} "
                "(dist:name disables one distribution's)"
            )
            self.problems.append(msg)
            warnings.warn(msg, LmcoreWarning, stacklevel=4)

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
        with self._lock:
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
        with self._lock:
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
        before = _torch_state()
        try:
            components = tuple(
                validate_component(c) for c in self._call(plugin, "lmcore_components")
            )
            presets = tuple(validate_preset(p) for p in self._call(plugin, "lmcore_presets"))
            _check_unique(components, presets)
            changed = _restore_torch_state(before)
            if changed:
                raise InvalidComponentError(f"its hooks {changed}")
        except BaseException as e:
            _restore_torch_state(before)
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

    def _call(self, plugin: object, hook: str) -> list[Any]:
        """Call one plugin's implementation of `hook`, so a failure is pinned on that plugin."""
        out: list[Any] = []
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
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

    # ---------------------------------------------------------------- queries

    def plugins(self) -> list[PluginRecord]:
        """Every plugin the registry saw: ok, failed or disabled."""
        self.load()
        with self._lock:  # a consistent copy, even while another thread registers
            return list(self._records.values())

    def entries(self, kind: str | None = None) -> list[Entry]:
        """Every component, with provenance and status (`shadowed` when another has its name)."""
        found = [
            (c, r.provenance)
            for r in self.plugins()
            if r.status == "ok"
            for c in r.components
            if kind is None or c.kind == kind
        ]
        counts: dict[tuple[str, str], int] = {}
        for c, _ in found:
            counts[c.kind, c.name] = counts.get((c.kind, c.name), 0) + 1
        return [Entry(c, p, "shadowed" if counts[c.kind, c.name] > 1 else "ok") for c, p in found]

    def preset_entries(self) -> list[PresetEntry]:
        found = [(p, r.provenance) for r in self.plugins() if r.status == "ok" for p in r.presets]
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
                        f"{clip(provider)} does not provide {kind} {clip(name)}"
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
            choices = ", ".join(format_qualified(m.provenance.qualifier, name) for m in matches)
            raise AmbiguousComponentError(
                f"{kind} {name!r} is provided by {len(matches)} plugins: "
                + "; ".join(str(m.provenance) for m in matches)
                + f". Neither is chosen for you: write one of {choices}, or disable one with "
                "LMCORE_DISABLE_PLUGINS"
            )
        records = self.plugins()
        failed = [r for r in records if r.status == "failed"]
        off = [r for r in records if r.status == "disabled"]
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
            f"no installed plugin provides {kind} {clip(name)}{hint}; "
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


# -------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class _Found:
    """One entry point of the group, or (`problem` set) one that cannot be loaded as it is."""

    provenance: Provenance
    entry_point: md.EntryPoint | None = None
    problem: str | None = None


def _discover(group: str) -> Iterator[_Found]:
    """The group's entry points, sorted by distribution and name, the first distribution of a
    name on sys.path winning (as `importlib.metadata.entry_points` does).

    Only distributions whose entry_points.txt has a ``[group]`` section are parsed, so another
    tool's malformed metadata never reaches lmcore; a plugin distribution whose metadata cannot be
    read is reported (`problem`) instead of raising.
    """
    section = re.compile(rf"^\s*\[{re.escape(group)}\]\s*$", re.M)
    found: list[_Found] = []
    seen: set[str] = set()
    for dist in md.distributions():
        try:
            text = dist.read_text("entry_points.txt")
        except Exception as e:  # unreadable: report it only if it may be ours
            raw = _raw_entry_points(dist)
            if raw is None or not section.search(raw):
                continue
            problem: str | None = f"its entry_points.txt cannot be read ({describe_exception(e)})"
            text = None
        else:
            if not text or not section.search(text):
                continue
            problem = None
        stem = _stem(dist)
        try:
            name, version = dist.metadata["Name"], dist.version
            if not name:
                raise ValueError("it has no Name field")
        except Exception as e:
            name, version = stem
            problem = problem or (
                f"the METADATA of {name} cannot be read ({describe_exception(e)}); reinstall it"
            )
        if normalize_dist(name) in seen:
            continue  # shadowed by the same distribution earlier on sys.path
        seen.add(normalize_dist(name))
        try:
            eps = list(dist.entry_points.select(group=group)) if text else []
        except Exception as e:
            eps, problem = [], f"its entry_points.txt cannot be parsed ({describe_exception(e)})"
        if eps:
            found += [
                _Found(Provenance(ep.name, ep.value, name, version), ep, problem) for ep in eps
            ]
        elif problem is not None:
            where = str(dist.locate_file(""))
            found.append(_Found(Provenance(f"({name})", where, name, version), None, problem))
    found.sort(key=lambda f: (f.provenance.dist or "", f.provenance.plugin))
    yield from found


def _raw_entry_points(dist: md.Distribution) -> str | None:
    path = getattr(dist, "_path", None)
    try:
        return (path / "entry_points.txt").read_bytes().decode("utf-8", "replace") if path else None
    except OSError:
        return None


def _stem(dist: md.Distribution) -> tuple[str, str]:
    """(name, version) from the folder name, ``name-1.0.dist-info``, when METADATA is unreadable."""
    folder = getattr(getattr(dist, "_path", None), "name", "?")
    name, _, rest = folder.partition("-")
    return name or "?", rest.rsplit(".", 1)[0] or "?"


def _qualified_key(dist: str, name: str) -> tuple[str, str]:
    return normalize_dist(dist.strip()), name.strip()


def malformed_entry_points() -> list[str]:
    """Installed distributions whose entry_points.txt `importlib.metadata` cannot parse (a
    line that is neither a [section], a # comment nor name = value; text that is not UTF-8),
    one sentence each naming the distribution and the line."""
    found = []
    for dist in md.distributions():
        try:
            text = dist.read_text("entry_points.txt") or ""
        except Exception as e:
            found.append(f"{_stem(dist)[0]}: its entry_points.txt cannot be read ({e})")
            continue
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            section = line.startswith("[") and line.endswith("]")
            if line and not line.startswith("#") and not section and "=" not in line:
                where = getattr(getattr(dist, "_path", None), "name", _stem(dist)[0])
                found.append(f"{where}/entry_points.txt line {number}, {line[:60]!r}, has no '='")
                break
    return found


def guard_torch_import() -> list[str]:
    """Call before torch is first imported. torch's import reads every installed distribution's
    entry points (to autoload device backends) and fails on a malformed entry_points.txt, even
    one of an unrelated tool; when there is one, that autoload is switched off for this process
    (TORCH_DEVICE_BACKEND_AUTOLOAD=0) so lmcore keeps working, with a warning naming it.
    Returns the warnings given."""
    if "torch" in sys.modules or os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") == "0":
        return []
    bad = malformed_entry_points()
    if not bad:
        return []
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    message = (
        f"malformed distribution metadata: {'; '.join(bad)}. importing torch would fail on it, "
        "so torch's device-backend autoload is off for this process "
        "(TORCH_DEVICE_BACKEND_AUTOLOAD=0); fix or uninstall that distribution"
    )
    warnings.warn(message, LmcoreWarning, stacklevel=2)
    return [message]


# -------------------------------------------------------------------- what plugins may not do


@contextlib.contextmanager
def _interrupts_noted() -> Iterator[dict[str, bool]]:
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
    except (ValueError, OSError):
        yield {"signalled": True}
        return
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def _torch_state() -> tuple[Any, ...] | None:
    """torch's process-wide defaults that a plugin could change behind every build."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled()


def _restore_torch_state(before: tuple[Any, ...] | None) -> str:
    """Undo a change of torch's defaults since `before`; say what changed ('' when nothing)."""
    after = _torch_state()
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


def _warn_slow(prov: Provenance, seconds: float) -> None:
    warnings.warn(
        f"plugin {prov.plugin!r} of {prov.dist} {prov.version} (module {prov.module}) has been "
        f"importing for {seconds:g} s; lmcore waits for it. Skip it with "
        f"LMCORE_DISABLE_PLUGINS={format_qualified(prov.qualifier, prov.plugin)}",
        SlowPluginWarning,
        stacklevel=1,
    )


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


# -------------------------------------------------------------------- processes

# A fork waits for any registry being loaded, so a child never inherits a half-loaded one (or
# a lock held by a thread it does not have): the logging module does the same with its locks.
_REGISTRIES: weakref.WeakSet[Registry] = weakref.WeakSet()


def _before_fork() -> None:
    for registry in list(_REGISTRIES):
        registry._lock.acquire()


def _after_fork() -> None:
    for registry in list(_REGISTRIES):
        with contextlib.suppress(RuntimeError):
            registry._lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork
    )


# -------------------------------------------------------------------- the current registry

_default: Registry | None = None
_default_lock = threading.Lock()
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
        with _default_lock:  # threads asking first at once share one registry
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
