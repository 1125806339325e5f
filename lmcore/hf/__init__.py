"""Hugging Face interop: model directories to lmcore checkpoints and back (`lmcore convert`).

    from lmcore.hf import convert_from_hf, convert_to_hf, load_hf, save_hf

One module per family holds its tables (`llama.py`, `mistral.py`, ..., `qwen3_moe.py`: config
fields to the spec, tensor names to lmcore's keys, each module's `FAMILY`); `family.py` is the
reader and writer of config.json that all share, `weights.py` the tensor layouts (the rotary
permutation, transposed and fused tensors), `convert.py` reads and writes the directories.
Names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcore.hf.convert import (
        CONFIG_KEY,
        INDEX,
        WEIGHTS,
        config_path,
        convert_from_hf,
        convert_to_hf,
        hf_config,
        hf_reading,
        load_hf,
        load_llama,
        save_hf,
        save_llama,
    )
    from lmcore.hf.family import (
        FAMILIES,
        PASSIVE,
        Family,
        Reading,
        config_to_spec,
        family_of,
        read_config,
        spec_to_config,
    )
    from lmcore.hf.weights import (
        Weight,
        from_hf_state_dict,
        permute_from_hf,
        permute_to_hf,
        to_hf_state_dict,
    )

_WHERE = {
    **dict.fromkeys(
        (
            "CONFIG_KEY",
            "INDEX",
            "WEIGHTS",
            "config_path",
            "convert_from_hf",
            "convert_to_hf",
            "hf_config",
            "hf_reading",
            "load_hf",
            "load_llama",
            "save_hf",
            "save_llama",
        ),
        "convert",
    ),
    **dict.fromkeys(
        (
            "FAMILIES",
            "PASSIVE",
            "Family",
            "Reading",
            "config_to_spec",
            "family_of",
            "read_config",
            "spec_to_config",
        ),
        "family",
    ),
    **dict.fromkeys(
        ("Weight", "from_hf_state_dict", "permute_from_hf", "permute_to_hf", "to_hf_state_dict"),
        "weights",
    ),
}

__all__ = [
    "CONFIG_KEY",
    "FAMILIES",
    "INDEX",
    "PASSIVE",
    "WEIGHTS",
    "Family",
    "Reading",
    "Weight",
    "config_path",
    "config_to_spec",
    "convert_from_hf",
    "convert_to_hf",
    "family_of",
    "from_hf_state_dict",
    "hf_config",
    "hf_reading",
    "load_hf",
    "load_llama",
    "permute_from_hf",
    "permute_to_hf",
    "read_config",
    "save_hf",
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
