"""What the registry records: where a component or preset came from (`Provenance`), a component
or preset with it (`Entry`, `PresetEntry`), and each plugin's status (`PluginRecord`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lmcore.components import Component, Preset, count_or_unknown, invoke

PluginStatus = Literal["ok", "failed", "disabled"]
ComponentStatus = Literal["ok", "shadowed"]


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
