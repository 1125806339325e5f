"""lmcore/hf/olmo3.py: OLMo 3's sliding layers by `layer_types` (three in four by default) and its
rotary parameters per layer type, read and written; what it cannot hold refused by name. Its
tiny model converted both ways: tests/cli/test_convert_hf_families.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lmcore import ConversionError
from lmcore.blueprint import resolve
from lmcore.hf import config_to_spec, spec_to_config
from lmcore.hf.olmo3 import FAMILY
from tests.helpers.errors import raises_naming
from tests.helpers.hf import quiet_transformers

transformers = quiet_transformers()
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

SIZES = "vocab_size=97,context_length=64,d_model=32,num_layers=4,num_heads=4,num_kv_heads=2,d_ff=48"
OLMO = "block=reordered, qk_norm=rmsnorm, qk_norm_scope=full"


def _config(**change: Any) -> dict[str, Any]:
    return {**AutoConfig.for_model("olmo3", num_hidden_layers=4).to_dict(), **change}


def test_without_layer_types_three_layers_in_four_slide_as_transformers_says() -> None:
    config = _config(sliding_window=6)
    del config["layer_types"]
    assert config_to_spec(config) == config_to_spec(_config(sliding_window=6))
    assert "pos=rope(theta=500000.0)," in config_to_spec(config)
    assert ",window[0:3]=6" in config_to_spec(config)


def test_transformers_4_rope_fields_go_to_the_full_layers_as_transformers_5_reads_them() -> None:
    config = _config(rope_scaling={"rope_type": "linear", "factor": 4.0})
    del config["rope_parameters"]
    spec = config_to_spec(config)
    assert "pos=rope(theta=500000.0),pos[3]=rope(theta=500000.0,scaling=linear,factor=4.0)" in spec
    theirs = AutoConfig.for_model(
        "olmo3", num_hidden_layers=4, rope_scaling={"rope_type": "linear", "factor": 4.0}
    )
    assert theirs.rope_parameters["full_attention"]["factor"] == 4.0
    assert theirs.rope_parameters["sliding_attention"]["rope_type"] == "default"


def test_a_base_per_window_is_written_per_layer_type_and_read_back() -> None:
    bp = resolve(
        f"{SIZES}, {OLMO}, pos=rope(theta=1000.0), pos[1]=rope(theta=9.0), window=5, window[1]=0"
    )
    config = spec_to_config(bp, torch.float32, family=FAMILY)
    assert config["rope_parameters"] == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 9.0},
    }
    assert config["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert config_to_spec(config) == str(bp.spec)


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
         ('rope_parameters rope_theta=10000.0, rope_type="default"', "per layer type")),
        ({"rope_parameters": None, "rope_theta": 1e4},
         ("rope_theta=10000.0 without rope_parameters.sliding_attention",
          "transformers 5 rotates the sliding layers with 500000.0")),
        ({"rope_parameters": {"sliding_attention": {"rope_type": "dynamic", "factor": 2.0},
                              "full_attention": {"rope_type": "default"}}},
         ('rope_parameters.sliding_attention: rope type "dynamic"',)),
        ({"sliding_window": None}, ('sliding_window=null with "sliding_attention" layers',)),
        ({"layer_types": ["conv"] * 4}, ('layer_types=["conv", "conv", "conv", "conv"]',)),
        ({"attention_bias": 1}, ("attention_bias=1 is not true or false",)),
    ],
)  # fmt: skip
def test_what_olmo3_cannot_express_is_refused_by_name(
    change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    with raises_naming(ConversionError, "DIR/config.json: ", "Hugging Face olmo3 config", *facts):
        config_to_spec(_config(**change), "DIR/config.json")


def test_a_model_olmo3_cannot_hold_is_refused_by_name() -> None:
    bp = resolve(f"{SIZES}, {OLMO}, pos[1]=rope(theta=9.0)")  # a base of its own on one full layer
    with raises_naming(ConversionError, "Olmo3ForCausalLM", "pos[1]=rope(theta=9.0)"):
        spec_to_config(bp, torch.float32, family=FAMILY)


def test_yarn_on_the_full_layers_as_olmo3_long_context_checkpoints_have_converts_both_ways(
    tmp_path: Path,
) -> None:
    from lmcore.hf import load_hf, save_hf
    from tests.helpers.hf import FAMILY_CONFIGS
    from tests.helpers.models import perturb

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
            "attention_factor": 1.2, "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 1e4}  # fmt: skip
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
        "full_attention": yarn,
    }
    config = AutoConfig.for_model("olmo3", **{**FAMILY_CONFIGS["olmo3"], "rope_parameters": rope})
    torch.manual_seed(0)
    theirs = perturb(AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval())
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_hf(tmp_path / "hf").eval()
    assert "pos[3]=rope(theta=10000.0,scaling=yarn,factor=4.0," in str(ours.spec)
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max() <= 1e-4
        save_hf(ours, tmp_path / "back")
        back = AutoModelForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager")
        assert (back.eval()(ids).logits - theirs(ids).logits).abs().max() <= 1e-4
