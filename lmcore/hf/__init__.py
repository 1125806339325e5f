"""Hugging Face interop: model directories to lmcore checkpoints and back (`lmcore convert`).

    from lmcore.hf import convert_from_hf, convert_to_hf, load_llama, save_llama

One module per family holds its tables (`llama.py`: config fields, tensor names, the rotary
permutation); `convert.py` reads and writes the directories. Names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcore.hf.convert import (
        CONFIG_KEY,
        INDEX,
        WEIGHTS,
        convert_from_hf,
        convert_to_hf,
        load_llama,
        save_llama,
    )
    from lmcore.hf.llama import (
        ARCHITECTURE,
        FIELDS,
        KEYS,
        config_to_spec,
        from_hf_state_dict,
        permute_from_hf,
        permute_to_hf,
        spec_to_config,
        to_hf_state_dict,
    )

_WHERE = {
    "CONFIG_KEY": "convert",
    "INDEX": "convert",
    "WEIGHTS": "convert",
    "convert_from_hf": "convert",
    "convert_to_hf": "convert",
    "load_llama": "convert",
    "save_llama": "convert",
    "ARCHITECTURE": "llama",
    "FIELDS": "llama",
    "KEYS": "llama",
    "config_to_spec": "llama",
    "from_hf_state_dict": "llama",
    "permute_from_hf": "llama",
    "permute_to_hf": "llama",
    "spec_to_config": "llama",
    "to_hf_state_dict": "llama",
}

__all__ = [
    "ARCHITECTURE",
    "CONFIG_KEY",
    "FIELDS",
    "INDEX",
    "KEYS",
    "WEIGHTS",
    "config_to_spec",
    "convert_from_hf",
    "convert_to_hf",
    "from_hf_state_dict",
    "load_llama",
    "permute_from_hf",
    "permute_to_hf",
    "save_llama",
    "spec_to_config",
    "to_hf_state_dict",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'lmcore.hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"lmcore.hf.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *_WHERE]
