"""lmcore/hf/lfm2.py: LFM2's convolution and attention layers (`layer_types`, `full_attn_idxs`),
its feed-forward width as transformers adjusts it, read and written; what it cannot hold refused
by name. Its tiny model converted both ways: tests/cli/test_convert_hf_families.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmcore import ConversionError
from lmcore.blueprint import resolve
from lmcore.hf import config_to_spec, spec_to_config
from lmcore.hf.lfm2 import FAMILY, ff_width
from tests.helpers.errors import raises_naming
from tests.helpers.hf import quiet_transformers

transformers = quiet_transformers()
from transformers import AutoConfig  # noqa: E402
from transformers.models.lfm2.modeling_lfm2 import Lfm2MLP  # noqa: E402

SIZES = "vocab_size=97,context_length=64,d_model=32,num_layers=4,num_heads=4,num_kv_heads=2"


def _config(**change: Any) -> dict[str, Any]:
    return {**AutoConfig.for_model("lfm2", num_hidden_layers=4).to_dict(), **change}


@pytest.mark.parametrize(
    "size, adjust, multiplier, multiple_of",
    [(12288, True, 1.0, 256), (72, True, 1.3, 16), (100, True, 1, 7), (100, False, 1.5, 64),
     (4608, True, 1.5, 256), (10, True, 2, 3)],
)  # fmt: skip
def test_the_width_is_transformers_own(
    size: int, adjust: bool, multiplier: Any, multiple_of: int
) -> None:
    config = transformers.Lfm2Config(hidden_size=8, intermediate_size=size, block_auto_adjust_ff_dim=adjust,
                                     block_ffn_dim_multiplier=multiplier, block_multiple_of=multiple_of)  # fmt: skip
    with torch.device("meta"):
        theirs = Lfm2MLP(config).w1.out_features
    assert ff_width(size, adjust, multiplier, multiple_of) == theirs
    spec = config_to_spec(_config(intermediate_size=size, block_auto_adjust_ff_dim=adjust,
                                  block_ffn_dim_multiplier=multiplier, block_multiple_of=multiple_of))  # fmt: skip
    assert f",d_ff={theirs}," in spec


def test_a_null_multiplier_adjusts_without_rounding_as_lfm2_mlp_reads_it() -> None:
    # transformers 5's config refuses null; its Lfm2MLP (and transformers 4's config) read it so
    assert ",d_ff=66," in config_to_spec(
        _config(intermediate_size=100, block_ffn_dim_multiplier=None)
    )


def test_full_attn_idxs_name_the_attention_layers_when_layer_types_is_absent() -> None:
    config = _config(full_attn_idxs=[1, 3, 9], conv_L_cache=4)
    del config["layer_types"]
    assert ",mixer[0::2]=short_conv(conv_size=4,bias=false)," in config_to_spec(config)
    del config["full_attn_idxs"]  # then every layer attends, as transformers says
    assert "mixer" not in config_to_spec(config)
    config.update(layer_types=["conv", "full_attention"] * 2, full_attn_idxs=[0, 1, 2, 3])
    assert ",mixer[0::2]=short_conv(conv_size=4,bias=false)," in config_to_spec(config)
    theirs = transformers.Lfm2Config(num_hidden_layers=4, layer_types=config["layer_types"],
                                     full_attn_idxs=[0, 1, 2, 3])  # fmt: skip
    assert theirs.layer_types == config["layer_types"]  # layer_types counts, not the indices


def test_a_model_of_its_own_width_is_written_unadjusted_and_read_back() -> None:
    bp = resolve(
        f"{SIZES}, d_ff=50, tie_embeddings=true, qk_norm=rmsnorm, mixer=short_conv, mixer[2]=attention"
    )
    config = spec_to_config(bp, torch.float32, family=FAMILY)
    assert (config["intermediate_size"], config["block_auto_adjust_ff_dim"]) == (50, False)
    assert config["layer_types"] == ["conv", "conv", "full_attention", "conv"]
    assert config["full_attn_idxs"] == [2]
    assert config_to_spec(config) == str(bp.spec)


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"layer_types": ["conv", "mamba", "conv", "conv"]},
         ('layer_types=["conv", "mamba", "conv", "conv"]', 'a list of 4 "conv" or "full_attention"')),
        ({"full_attn_idxs": "all", "layer_types": None}, ('full_attn_idxs="all" is not a list of layer indices',)),
        ({"intermediate_size": 1}, ("intermediate_size=1", "a feed-forward 0 wide")),
        ({"block_ff_dim": 100, "intermediate_size": 200}, ("block_ff_dim=100 and intermediate_size=200 disagree",)),
        ({"tie_embedding": False}, ("tie_word_embeddings=true and tie_embedding=false disagree",)),
        ({"conv_bias": "no"}, ('conv_bias="no" is not true or false',)),
        ({"block_ffn_dim_multiplier": "1.0"}, ('block_ffn_dim_multiplier="1.0" is not a positive float',)),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}},
         ('rope type "dynamic"',)),
        ({"conv_L_cache": 1, "layer_types": ["conv", "full_attention"] * 2},
         ("gives a spec lmcore refuses", "conv_size=1")),
    ],
)  # fmt: skip
def test_what_lfm2_cannot_express_is_refused_by_name(
    change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    with raises_naming(ConversionError, "DIR/config.json: ", *facts):
        config_to_spec(_config(**change), "DIR/config.json")


@pytest.mark.parametrize(
    "spec, facts",
    [
        ("qkv_bias=true, mixer[0]=short_conv", ("qkv_bias=true",)),
        ("mixer=short_conv, mixer[1]=short_conv(conv_size=4)", ("mixer=short_conv",)),
        ("mixer[0]=mamba2", ("mixer[0]=mamba2",)),
    ],
)
def test_a_model_lfm2_cannot_hold_is_refused_by_name(spec: str, facts: tuple[str, ...]) -> None:
    bp = resolve(f"{SIZES}, qk_norm=rmsnorm, tie_embeddings=true, {spec}")
    with raises_naming(ConversionError, "Lfm2ForCausalLM", *facts):
        spec_to_config(bp, torch.float32, family=FAMILY)
