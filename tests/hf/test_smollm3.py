"""lmcore/hf/smollm3.py: SmolLM3's NoPE layers (`no_rope_layers`, `no_rope_layer_interval`) and
its sliding window by `layer_types`, read and written; what it cannot hold refused by name. Its
tiny model converted both ways: tests/cli/test_convert_hf_families.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmcore import ConversionError
from lmcore.blueprint import resolve
from lmcore.hf import config_to_spec, spec_to_config
from lmcore.hf.smollm3 import FAMILY
from tests.helpers.errors import raises_naming
from tests.helpers.hf import quiet_transformers

transformers = quiet_transformers()
from transformers import AutoConfig  # noqa: E402

SIZES = "vocab_size=97,context_length=64,d_model=32,num_layers=4,num_heads=4,num_kv_heads=2,d_ff=48"


def _config(**change: Any) -> dict[str, Any]:
    return {**AutoConfig.for_model("smollm3", num_hidden_layers=4).to_dict(), **change}


def test_without_lists_the_interval_and_the_window_give_transformers_default_layers() -> None:
    config = _config(use_sliding_window=True, sliding_window=6, no_rope_layer_interval=2)
    for absent in ("no_rope_layers", "layer_types"):
        config.pop(absent)
    spec = config_to_spec(config)
    assert "pos=rope(theta=2000000.0),pos[1::2]=nope" in spec and "window[1::2]=6" in spec
    theirs = AutoConfig.for_model(
        "smollm3", **{k: v for k, v in config.items() if k != "model_type"}
    )
    assert theirs.no_rope_layers == [1, 0, 1, 0]
    assert theirs.layer_types == ["full_attention", "sliding_attention"] * 2


def test_max_window_layers_which_transformers_smollm3_never_reads_is_kept() -> None:
    assert config_to_spec(_config(max_window_layers=28)) == config_to_spec(_config())


def test_a_first_nope_layer_and_all_nope_layers_are_written_and_read_back() -> None:
    for pos in ("pos=rope(theta=1000.0), pos[0]=nope", "pos=nope"):
        bp = resolve(f"{SIZES}, {pos}, tie_embeddings=true")
        config = spec_to_config(bp, torch.float32, family=FAMILY)
        assert config["no_rope_layers"] == ([0, 1, 1, 1] if "[0]" in pos else [0, 0, 0, 0])
        assert config_to_spec(config) == str(bp.spec)


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"no_rope_layers": [1, 0]},
         ("no_rope_layers=[1, 0]", "a list of at least 4 entries, 1 (the layer rotates) or 0 (NoPE)")),
        ({"no_rope_layers": [1, 2, 1, 1]}, ("no_rope_layers=[1, 2, 1, 1]",)),
        ({"no_rope_layers": None, "no_rope_layer_interval": 0},
         ("no_rope_layer_interval=0 is not a positive int",)),
        ({"use_sliding_window": False, "sliding_window": 6,
          "layer_types": ["sliding_attention", "full_attention"] * 2},
         ('layer_types names "sliding_attention" layers while use_sliding_window=false',
          "its flash attention does not")),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
         ('rope type "dynamic"',)),
    ],
)  # fmt: skip
def test_what_smollm3_cannot_express_is_refused_by_name(
    change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    with raises_naming(ConversionError, "DIR/config.json: ", "Hugging Face smollm3 config", *facts):
        config_to_spec(_config(**change), "DIR/config.json")


def test_a_model_smollm3_cannot_hold_is_refused_by_name() -> None:
    bp = resolve(f"{SIZES}, pos[1]=alibi")
    with raises_naming(ConversionError, "SmolLM3ForCausalLM", "pos[1]=alibi"):
        spec_to_config(bp, torch.float32, family=FAMILY)
