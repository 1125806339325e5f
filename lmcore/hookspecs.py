"""Hook specifications of the `lmcore` plugin host.

A plugin is any module (or object) named by an entry point in the group ``lmcore``. It implements
one or both hooks below, decorated with `lmcore.hookimpl`. The built-in components use exactly
these hooks, declared through the same entry-point group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from lmcore.components import Component, Preset

PROJECT = "lmcore"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def lmcore_components() -> Sequence[Component]:
    """Return the components this plugin provides.

    Each item is a `lmcore.Component`: its kind (``norm``, ``ffn``, ``pos``, ``attn`` or
    ``block``), its name, a factory taking flat keyword arguments, its declared arguments, and its
    parameter and FLOP counts as functions of the model shape. Called once per registry, when
    the registry loads.
    """
    raise NotImplementedError


@hookspec
def lmcore_presets() -> Sequence[Preset]:
    """Return the presets this plugin provides.

    Each item is a `lmcore.Preset`: a name usable as the first item of a spec string, and the
    spec text it expands to. Called once per registry, when the registry loads.
    """
    raise NotImplementedError
