"""Qwen3-Next (`lmcore.hf.qwen3_next`) beyond the tiny model every family converts
(tests/cli/test_convert_hf_families.py): a released checkpoint's form (every
`full_attention_interval`-th layer attends, no `layer_types`; the multi-token prediction head's
`mtp.*` tensors), attention biases (the gate's in q_proj's per-head rows), experts on every
`decoder_sparse_step`-th layer, and what Qwen3-Next cannot hold refused by name both ways."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmcore
from lmcore import ConversionError
from lmcore.hf import config_to_spec, convert_from_hf, convert_to_hf
from tests.helpers.errors import raises_naming
from tests.helpers.hf import FAMILY_CONFIGS, HF_VOCAB, quiet_transformers
from tests.helpers.models import perturb

transformers = quiet_transformers()
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

TOLERANCE = 1e-4  # max abs logit difference, float32


def test_a_released_checkpoints_form_converts_both_ways(tmp_path: Path) -> None:
    sizes = {k: v for k, v in FAMILY_CONFIGS["qwen3_next"].items() if k != "mlp_only_layers"}
    config = AutoConfig.for_model(
        "qwen3_next", **sizes, attention_bias=True, decoder_sparse_step=2
    )  # experts on layers 1 and 3, attention on 1 and 3
    torch.manual_seed(0)
    reference = perturb(AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    reference.eval().save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    saved = json.loads(path.read_text())
    del saved["layer_types"]  # as the released configs say it
    path.write_text(json.dumps({**saved, "full_attention_interval": 2}))
    weights = tmp_path / "hf" / "model.safetensors"
    save_file({**load_file(weights), "mtp.fc.weight": torch.ones(4, 4)}, weights)

    spec = lmcore.parse_spec(config_to_spec(json.loads(path.read_text())))
    assert [spec.at(i).mixer.name for i in range(4)] == ["gated_deltanet", "attention"] * 2
    assert [spec.at(i).ffn.name for i in range(4)] == ["swiglu", "moe"] * 2
    assert spec.qkv_bias and spec.out_bias and spec.attn_gate
    ids = torch.randint(0, HF_VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(ids).logits
        ours = lmcore.load(convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")).eval()
        got = ours(ids)
    assert (got - expected).abs().max() <= TOLERANCE

    back = convert_to_hf(tmp_path / "m.safetensors", tmp_path / "back")
    written = json.loads((back / "config.json").read_text())
    assert written["full_attention_interval"] == 2  # still what it said, kept
    assert written["layer_types"] == ["linear_attention", "full_attention"] * 2
    again, info = AutoModelForCausalLM.from_pretrained(
        back, attn_implementation="eager", output_loading_info=True
    )
    assert not any(info.values()), info
    with torch.no_grad():
        assert (again.eval()(ids).logits - got).abs().max() <= TOLERANCE


def _config(**change: Any) -> dict[str, Any]:
    return {**AutoConfig.for_model("qwen3_next", num_hidden_layers=4).to_dict(), **change}


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"layer_types": ["linear_attention", "sliding_attention"] * 2},
         ('layer_types=["linear_attention", "sliding_attention"', 'a list of 4 "linear_attention" '
          'or "full_attention"')),
        ({"layer_types": ["full_attention"] * 3},
         ('layer_types=["full_attention", "full_attention", "full_attention"]',)),
        ({"full_attention_interval": 2},
         ("layer_types and full_attention_interval=2 disagree",)),
        ({"full_attention_interval": 0}, ("full_attention_interval=0 is not a positive int",)),
        ({"hidden_act": "gelu"}, ('hidden_act="gelu"', "use silu")),
        ({"shared_expert_intermediate_size": 0},
         ("shared_expert_intermediate_size=0 is not a positive int",)),
        ({"linear_num_value_heads": "32"}, ('linear_num_value_heads="32" is not a positive int',)),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}},
         ('rope type "dynamic"',)),
        ({"partial_rotary_factor": 1.5, "rope_parameters": None},
         ("partial_rotary_factor=1.5 is above 1",)),
],
)  # fmt: skip
def test_what_qwen3_next_cannot_express_is_refused_by_name(
    change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    with raises_naming(
        ConversionError,
        "DIR/config.json: ",
        "cannot convert this Hugging Face qwen3_next config to lmcore",
        *facts,
    ):
        config_to_spec(_config(**change), "DIR/config.json")


def test_a_trillion_layers_at_the_default_interval_are_refused_quickly() -> None:
    config = {k: v for k, v in _config(num_hidden_layers=10**12).items() if k != "layer_types"}
    with raises_naming(
        ConversionError, "full attention (full_attention_interval=4)", "1,000,000,000,000 layers"
    ):
        config_to_spec(config)


SPEC = config_to_spec(AutoConfig.for_model("qwen3_next", **FAMILY_CONFIGS["qwen3_next"]).to_dict())


@pytest.mark.parametrize(
    "edit, facts",
    [
        (("attn_gate=true", "attn_gate=false"),
         ("attn_gate=false: a Qwen3NextForCausalLM has attn_gate=true",)),
        (("shared_gate=sigmoid", "shared_gate=none"), ("shared_gate=none", "shared_gate=sigmoid")),
        (("conv_size=4,chunk_size=64,eps=1e-06", "conv_size=4,chunk_size=64,eps=1e-05"),
         ("eps=1e-05", "a Qwen3NextForCausalLM has")),
        (("norm=rmsnorm(eps=1e-06,zero_centered=true)", "norm=rmsnorm(eps=1e-06)"),
         ("norm=rmsnorm(eps=1e-06): a Qwen3NextForCausalLM has",)),
],
)  # fmt: skip
def test_a_model_qwen3_next_cannot_hold_is_refused_by_name(
    edit: tuple[str, str], facts: tuple[str, ...], tmp_path: Path
) -> None:
    assert edit[0] in SPEC
    model = lmcore.build_model(SPEC.replace(*edit))
    with raises_naming(ConversionError, "Qwen3NextForCausalLM", *facts):
        lmcore.hf.save_hf(model, tmp_path / "out", model_type="qwen3_next")
    assert not (tmp_path / "out").exists()
