"""Hugging Face interop: model directories to lmcore checkpoints and back (`lmcore convert`).

    from lmcore.hf import convert_from_hf, convert_to_hf, load_hf, save_hf

One module per family holds its tables (`llama.py`, `mistral.py`, ..., `qwen3_moe.py`: config
fields to the spec, tensor names to lmcore's keys, each module's `FAMILY`); `family.py` is the
reader and writer of config.json that all share, `weights.py` the tensor layouts (the rotary
permutation, transposed and fused tensors), `convert.py` reads and writes the directories.
Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcore.lazy import attach

if TYPE_CHECKING:
    from lmcore.hf.convert import CONFIG_KEY as CONFIG_KEY
    from lmcore.hf.convert import INDEX as INDEX
    from lmcore.hf.convert import WEIGHTS as WEIGHTS
    from lmcore.hf.convert import config_path as config_path
    from lmcore.hf.convert import convert_from_hf as convert_from_hf
    from lmcore.hf.convert import convert_to_hf as convert_to_hf
    from lmcore.hf.convert import hf_config as hf_config
    from lmcore.hf.convert import hf_reading as hf_reading
    from lmcore.hf.convert import load_hf as load_hf
    from lmcore.hf.convert import load_llama as load_llama
    from lmcore.hf.convert import save_hf as save_hf
    from lmcore.hf.convert import save_llama as save_llama
    from lmcore.hf.family import FAMILIES as FAMILIES
    from lmcore.hf.family import PASSIVE as PASSIVE
    from lmcore.hf.family import Family as Family
    from lmcore.hf.family import Reading as Reading
    from lmcore.hf.family import config_to_spec as config_to_spec
    from lmcore.hf.family import family_of as family_of
    from lmcore.hf.family import read_config as read_config
    from lmcore.hf.family import spec_to_config as spec_to_config
    from lmcore.hf.weights import Weight as Weight
    from lmcore.hf.weights import from_hf_state_dict as from_hf_state_dict
    from lmcore.hf.weights import permute_from_hf as permute_from_hf
    from lmcore.hf.weights import permute_to_hf as permute_to_hf
    from lmcore.hf.weights import to_hf_state_dict as to_hf_state_dict

__getattr__, __dir__ = attach(__name__)
