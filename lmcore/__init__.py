"""lmcore: build decoder-only transformer LMs from spec strings and plugin components.

    >>> import lmcore
    >>> model = lmcore.build_model("cs336-tiny, pos=nope")
    >>> str(model.spec)  # the canonical spec
    >>> lmcore.save(model, "m.safetensors"); same = lmcore.load("m.safetensors")
    >>> lmcore.load("runs/quickstart")  # a run directory: its newest checkpoint

Names are imported on first use (PEP 562): `import lmcore` loads neither torch nor any plugin,
so lmcore's pytest plugin costs nothing in test runs that never ask for it.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from lmcore.version import __version__ as __version__

if TYPE_CHECKING:
    from lmcore.blueprint import Blueprint, parse_spec, resolve
    from lmcore.checkpoint import load_state_dict_file, read_info, save
    from lmcore.components import KINDS, REQUIRED, Arg, Component, Preset
    from lmcore.errors import (
        AmbiguousComponentError,
        CheckpointError,
        CheckpointWarning,
        ComponentNotFoundError,
        ConversionError,
        DataError,
        LmcoreError,
        ModelInputError,
        PluginFailedError,
        PluginLoadError,
        RegistryError,
        SpecError,
        TrainError,
    )
    from lmcore.hookspecs import hookimpl
    from lmcore.model.transformer import TransformerLM, build_model
    from lmcore.registry import Registry, get_registry, scoped_registry, use_registry
    from lmcore.sources import load
    from lmcore.spec import ComponentSpec, ModelSpec
    from lmcore.train.config import TrainConfig

_WHERE = {
    "Blueprint": "blueprint",
    "parse_spec": "blueprint",
    "resolve": "blueprint",
    "load": "sources",
    "load_state_dict_file": "checkpoint",
    "read_info": "checkpoint",
    "save": "checkpoint",
    "KINDS": "components",
    "REQUIRED": "components",
    "Arg": "components",
    "Component": "components",
    "Preset": "components",
    "AmbiguousComponentError": "errors",
    "CheckpointError": "errors",
    "CheckpointWarning": "errors",
    "ComponentNotFoundError": "errors",
    "ConversionError": "errors",
    "DataError": "errors",
    "LmcoreError": "errors",
    "ModelInputError": "errors",
    "PluginFailedError": "errors",
    "PluginLoadError": "errors",
    "RegistryError": "errors",
    "SpecError": "errors",
    "TrainError": "errors",
    "hookimpl": "hookspecs",
    "TransformerLM": "model.transformer",
    "build_model": "model.transformer",
    "Registry": "registry",
    "get_registry": "registry",
    "scoped_registry": "registry",
    "use_registry": "registry",
    "ComponentSpec": "spec",
    "ModelSpec": "spec",
    "TrainConfig": "train.config",
}

__all__ = [
    "KINDS",
    "REQUIRED",
    "AmbiguousComponentError",
    "Arg",
    "Blueprint",
    "CheckpointError",
    "CheckpointWarning",
    "Component",
    "ComponentNotFoundError",
    "ComponentSpec",
    "ConversionError",
    "DataError",
    "LmcoreError",
    "ModelInputError",
    "ModelSpec",
    "PluginFailedError",
    "PluginLoadError",
    "Preset",
    "Registry",
    "RegistryError",
    "SpecError",
    "TrainConfig",
    "TrainError",
    "TransformerLM",
    "build_model",
    "get_registry",
    "hookimpl",
    "load",
    "load_state_dict_file",
    "parse_spec",
    "read_info",
    "resolve",
    "save",
    "scoped_registry",
    "use_registry",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lmcore' has no attribute {name!r}")
    if "torch" not in sys.modules:  # torch's import fails on malformed metadata: see there
        from lmcore.registry import guard_torch_import

        guard_torch_import()
    value = getattr(importlib.import_module(f"lmcore.{_WHERE[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return [*globals(), *_WHERE]
