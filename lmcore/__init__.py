"""lmcore: build decoder-only transformer LMs from spec strings and plugin components.

>>> import lmcore
>>> model = lmcore.build_model("cs336-tiny, pos=nope")
>>> str(model.spec)  # the canonical spec
"""

from lmcore.components import KINDS, REQUIRED, Arg, Component, Preset
from lmcore.errors import (
    AmbiguousComponentError,
    ComponentNotFoundError,
    LmcoreError,
    ModelInputError,
    PluginFailedError,
    PluginLoadError,
    RegistryError,
    SpecError,
)
from lmcore.hookspecs import hookimpl
from lmcore.model import TransformerLM, build_model
from lmcore.registry import Registry, get_registry, scoped_registry, use_registry
from lmcore.spec import ComponentSpec, ModelSpec, parse_spec

__version__ = "0.1.0"

__all__ = [
    "KINDS",
    "REQUIRED",
    "AmbiguousComponentError",
    "Arg",
    "Component",
    "ComponentNotFoundError",
    "ComponentSpec",
    "LmcoreError",
    "ModelInputError",
    "ModelSpec",
    "PluginFailedError",
    "PluginLoadError",
    "Preset",
    "Registry",
    "RegistryError",
    "SpecError",
    "TransformerLM",
    "build_model",
    "get_registry",
    "hookimpl",
    "parse_spec",
    "scoped_registry",
    "use_registry",
]
