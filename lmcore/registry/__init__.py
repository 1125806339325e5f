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

The modules, by concern: `records` (`Provenance`, `Entry`, `PluginRecord`), `discovery` (the
entry points in the installed metadata), `isolation` (what a plugin may not do while it loads),
`loading` (a registry's plugins, loaded once), `lookup` (`Registry`: the queries and the choice
among providers), `current` (the registry in use).
"""

from __future__ import annotations

from lmcore.registry.current import get_registry, scoped_registry, use_registry
from lmcore.registry.discovery import GROUP, guard_torch_import, malformed_entry_points
from lmcore.registry.loading import SLOW_IMPORT_SECONDS
from lmcore.registry.lookup import Registry
from lmcore.registry.records import (
    ComponentStatus,
    Entry,
    PluginRecord,
    PluginStatus,
    PresetEntry,
    Provenance,
    normalize_dist,
)

__all__ = [
    "GROUP",
    "SLOW_IMPORT_SECONDS",
    "ComponentStatus",
    "Entry",
    "PluginRecord",
    "PluginStatus",
    "PresetEntry",
    "Provenance",
    "Registry",
    "get_registry",
    "guard_torch_import",
    "malformed_entry_points",
    "normalize_dist",
    "scoped_registry",
    "use_registry",
]
