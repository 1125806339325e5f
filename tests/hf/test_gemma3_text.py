"""Gemma 3's table (`lmcore.hf.gemma3_text`): local and global layers with their own rotary
bases from transformers 4's fields and 5's `rope_parameters` alike, the sliding-window pattern,
what lmcore cannot hold refused by name both ways, and the multimodal `gemma3` refused by name.
Both ways against transformers' modeling code: tests/cli/test_convert_hf_families.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore import ConversionError
from lmcore.hf import config_to_spec, convert_from_hf, convert_to_hf
from tests.helpers.errors import raises_naming
from tests.helpers.hf import FAMILY_CONFIGS, HF_VOCAB, quiet_transformers
from tests.helpers.models import perturb

transformers = quiet_transformers()
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

# google/gemma-3-4b-it's text model as transformers 4 wrote it, 8 layers instead of 34.
GEMMA3_V4 = {
    "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024,
    "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
    "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "cache_implementation": "hybrid", "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
}  # fmt: skip


def test_a_transformers_4_config_reads_as_transformers_5_reads_it() -> None:
    spec = config_to_spec(GEMMA3_V4)
    assert "pos=rope(theta=10000.0),pos[5]=rope(theta=1000000.0,scaling=linear,factor=8.0)" in (
        spec
    )
    assert "window[0:5,6:]=1024" in spec and "block=sandwich" in spec
    assert "qk_norm=rmsnorm(eps=1e-06,zero_centered=true)" in spec
    assert "logit_softcap" not in spec and "attn_softcap" not in spec
    fields = {k: v for k, v in GEMMA3_V4.items() if k != "model_type"}
    again = AutoConfig.for_model("gemma3_text", **fields).to_dict()  # rope_parameters by type
    assert set(again["rope_parameters"]) == {"full_attention", "sliding_attention"}
    assert config_to_spec(again) == spec


def test_the_default_pattern_is_five_local_layers_to_one_global() -> None:
    spec = config_to_spec({"model_type": "gemma3_text", "num_hidden_layers": 12})
    assert "pos=rope(theta=10000.0),pos[5::6]=rope(theta=1000000.0)" in spec
    assert "window[0:5,6:11]=4096" in spec
    few = config_to_spec({"model_type": "gemma3_text", "num_hidden_layers": 4})  # all local
    assert "pos=rope(theta=10000.0)," in few and "pos[" not in few and "window=4096" in few
    alike = {"model_type": "gemma3_text", "num_hidden_layers": 4, "sliding_window_pattern": 1}
    assert "pos=rope(theta=1000000.0)," in config_to_spec(alike)  # all global


def _model(directory: Path, **change: Any) -> Any:
    torch.manual_seed(0)
    config = AutoConfig.for_model("gemma3_text", **{**FAMILY_CONFIGS["gemma3_text"], **change})
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    perturb(model).save_pretrained(directory)
    return model


def test_scaled_local_layers_are_written_as_transformers_5s_rope_parameters(
    tmp_path: Path,
) -> None:
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50.0},
    }
    reference = _model(tmp_path / "hf", rope_scaling=None, rope_parameters=rope)
    ids = torch.randint(0, HF_VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    out = convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")
    ours = lmcore.load(out).eval()
    assert "pos=rope(theta=50.0,scaling=linear,factor=4.0)" in str(ours.spec)
    back = convert_to_hf(out, tmp_path / "back")
    config = json.loads((back / "config.json").read_text())
    assert config["rope_parameters"]["sliding_attention"]["factor"] == 4.0
    assert "rope_local_base_freq" not in config
    again = AutoModelForCausalLM.from_pretrained(back, attn_implementation="eager").eval()
    with torch.no_grad():
        expected, got = reference(ids).logits, ours(ids)
        assert (got - expected).abs().max() <= 1e-4
        assert (again(ids).logits - got).abs().max() <= 1e-4


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0}}},
         ('rope_parameters.full_attention.rope_type="yarn"', 'none ("default") or "linear"')),
        ({"rope_parameters": {"rope_type": "linear", "factor": 8.0}},
         ('rope_parameters={"rope_type": "linear"', "reads rotary parameters by layer type")),
        ({"rope_scaling": {"type": "linear", "factor": 8.0}},
         ('rope_scaling.type="linear"', 'write "rope_type": "linear"')),
        ({"rope_theta": 5.0}, ("rope_theta=5.0 and rope_parameters.full_attention.rope_theta",
                               "disagree")),
        ({"rope_local_base_freq": 5.0},
         ("rope_local_base_freq=5.0 and rope_parameters.sliding_attention.rope_theta",)),
        ({"rope_parameters": {"sliding_attention": {"rope_theta": 1e4,
                                                    "partial_rotary_factor": 0.5}}},
         ("rope_parameters.sliding_attention.partial_rotary_factor=0.5", "reads none of them")),
        ({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1e6}}},
         ("full_attention's rope linear scaling without factor",)),
        ({"use_bidirectional_attention": True},
         ("use_bidirectional_attention=true", "lmcore's attention is causal")),
        ({"layer_types": None, "sliding_window_pattern": "six"},
         ('sliding_window_pattern="six" is not a positive int',)),
        ({"hidden_activation": "relu"}, ('hidden_activation="relu"', "a gated MLP's activation")),
        ({"hidden_act": "silu"}, ("fields lmcore does not know", "hidden_act")),
    ],
)  # fmt: skip
def test_what_gemma3_cannot_hold_is_refused_by_name(
    change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    config = {**AutoConfig.for_model("gemma3_text", num_hidden_layers=6).to_dict(), **change}
    with raises_naming(
        ConversionError, "DIR/config.json: ", "Hugging Face gemma3_text config", *facts
    ):
        config_to_spec(config, "DIR/config.json")


def test_a_model_gemma3_cannot_hold_is_refused_by_name_when_written(tmp_path: Path) -> None:
    _model(tmp_path / "hf")
    spec = config_to_spec(json.loads((tmp_path / "hf" / "config.json").read_text()))
    assert ",pos=rope(theta=50.0),pos[1::2]=rope(theta=1000.0,scaling=linear,factor=2.0)," in spec
    two_local_bases = lmcore.build_model(spec + ",pos[2]=rope(theta=7.0)")
    with pytest.raises(ConversionError, match=r"pos\[2\]=rope\(theta=7.0\): a Gemma3ForCausalLM"):
        lmcore.hf.save_hf(two_local_bases, tmp_path / "out", model_type="gemma3_text")


def test_the_multimodal_gemma3_is_refused_naming_its_language_model() -> None:
    with raises_naming(
        ConversionError, "DIR/config.json: model_type 'gemma3'", "Gemma3ForConditionalGeneration",
        "multimodal", "text_config", "'gemma3_text'", "Gemma3ForCausalLM",
    ):  # fmt: skip
        config_to_spec(AutoConfig.for_model("gemma3").to_dict(), "DIR/config.json")
