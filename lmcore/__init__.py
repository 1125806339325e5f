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

import sys
from typing import TYPE_CHECKING

from lmcore.lazy import attach
from lmcore.version import __version__ as __version__

if TYPE_CHECKING:
    from lmcore.blueprint import Blueprint as Blueprint
    from lmcore.blueprint import parse_spec as parse_spec
    from lmcore.blueprint import resolve as resolve
    from lmcore.checkpoint import load_state_dict_file as load_state_dict_file
    from lmcore.checkpoint import read_info as read_info
    from lmcore.checkpoint import save as save
    from lmcore.components import KINDS as KINDS
    from lmcore.components import REQUIRED as REQUIRED
    from lmcore.components import Arg as Arg
    from lmcore.components import Component as Component
    from lmcore.components import Preset as Preset
    from lmcore.errors import AmbiguousComponentError as AmbiguousComponentError
    from lmcore.errors import CheckpointError as CheckpointError
    from lmcore.errors import CheckpointWarning as CheckpointWarning
    from lmcore.errors import ComponentNotFoundError as ComponentNotFoundError
    from lmcore.errors import ConversionError as ConversionError
    from lmcore.errors import DataError as DataError
    from lmcore.errors import LmcoreError as LmcoreError
    from lmcore.errors import ModelInputError as ModelInputError
    from lmcore.errors import PluginFailedError as PluginFailedError
    from lmcore.errors import PluginLoadError as PluginLoadError
    from lmcore.errors import RegistryError as RegistryError
    from lmcore.errors import SpecError as SpecError
    from lmcore.errors import TrainError as TrainError
    from lmcore.hookspecs import hookimpl as hookimpl
    from lmcore.model.transformer import TransformerLM as TransformerLM
    from lmcore.model.transformer import build_model as build_model
    from lmcore.registry import Registry as Registry
    from lmcore.registry import get_registry as get_registry
    from lmcore.registry import scoped_registry as scoped_registry
    from lmcore.registry import use_registry as use_registry
    from lmcore.sources import load as load
    from lmcore.spec import ComponentSpec as ComponentSpec
    from lmcore.spec import ModelSpec as ModelSpec
    from lmcore.train.config import TrainConfig as TrainConfig


def _guard_torch() -> None:
    if "torch" not in sys.modules:  # torch's import fails on malformed metadata: see there
        from lmcore.registry import guard_torch_import

        guard_torch_import()


__getattr__, __dir__ = attach(__name__, before=_guard_torch)
