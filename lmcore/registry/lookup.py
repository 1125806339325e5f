"""`Registry`: components and presets by kind and name, over the plugins it loads on first use;
the choice among providers of one name, and the error that says why none is chosen."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lmcore.components import Component, Preset, format_qualified
from lmcore.errors import (
    AmbiguousComponentError,
    ComponentNotFoundError,
    PluginFailedError,
    clip,
    did_you_mean,
    one_of,
)
from lmcore.registry.discovery import GROUP
from lmcore.registry.loading import Plugins
from lmcore.registry.records import Entry, PluginRecord, PresetEntry, normalize_dist


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
        self._plugins = Plugins(autoload=autoload, disabled=disabled, strict=strict, group=group)

    # ---------------------------------------------------------------- options

    @property
    def group(self) -> str:
        return self._plugins.group

    @property
    def strict(self) -> bool:
        return self._plugins.strict

    @property
    def autoload(self) -> bool:
        return self._plugins.autoload

    @property
    def disabled(self) -> set[str]:
        return self._plugins.disabled

    @property
    def problems(self) -> list[str]:
        """Problems that are not plugin failures (e.g. a disabled name no plugin has)."""
        return self._plugins.problems

    # ---------------------------------------------------------------- plugins

    def load(self) -> Registry:
        """Scan entry points once; later calls do nothing. Returns self.

        Thread-safe: concurrent callers wait for the one that loads. A plugin that asks the
        registry for something while it is being imported sees what is loaded so far.
        """
        self._plugins.load()
        return self

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a module or object implementing the hooks; returns its plugin name.

        Errors raise at once (no isolation): the caller is the one who can fix them.
        """
        module = getattr(plugin, "__module__", None) or getattr(plugin, "__name__", "?")
        self.load()
        return self._plugins.register(
            plugin, name or getattr(plugin, "__name__", None), str(module)
        )

    def add(self, *items: Component | Preset, name: str | None = None) -> str:
        """Register components and presets directly (notebooks, tests); returns the plugin name."""
        # Provenance names where the first component's factory lives, not this module.
        builds = [i.build for i in items if isinstance(i, Component)]
        module = getattr(builds[0], "__module__", None) if builds else None
        self.load()
        return self._plugins.add(items, name, module or "__main__")

    def unregister(self, name: str) -> None:
        """Remove a plugin (programmatic or loaded) and everything it provided."""
        self.load()
        self._plugins.unregister(name)

    def plugins(self) -> list[PluginRecord]:
        """Every plugin the registry saw: ok, failed or disabled."""
        self.load()
        return self._plugins.records()

    # ---------------------------------------------------------------- queries

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
        chosen = choose(kind, name, provider, matches)
        if chosen is not None:
            return chosen
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


def choose(kind: str, name: str, provider: str | None, matches: Sequence[Any]) -> Any:
    """The one of `matches` (the entries of `kind` called `name`) that `provider` (a `dist:`
    qualifier) picks, or without one the only one; None when no plugin provides the name. Two
    or more that fit raise `AmbiguousComponentError`; none from the provider asked for, when
    others provide the name, `ComponentNotFoundError`."""
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
    return None
