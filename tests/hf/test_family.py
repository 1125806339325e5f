"""A Hugging Face family as data (`lmcore.hf.family`, the tables of `lmcore.hf.<family>`): a
config.json to a spec and back, what a config holds that lmcore cannot express refused by name,
every family's default parameter count as Hugging Face's own (counted on the meta device on both
sides). Each family converted both ways by `lmcore convert`: tests/cli/test_convert_hf_families.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore import ConversionError
from lmcore.hf import (
    FAMILIES,
    config_to_spec,
    convert_from_hf,
    convert_to_hf,
    read_config,
    save_llama,
)
from tests.helpers.errors import raises_naming
from tests.helpers.hf import HF_SPEC as SMALL
from tests.helpers.hf import LLAMA_V4, quiet_transformers, random_family_model

transformers = quiet_transformers()
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def test_a_transformers_4_config_maps_to_a_spec() -> None:
    spec = lmcore.parse_spec(config_to_spec(LLAMA_V4))
    assert str(spec) == (
        "vocab_size=97,context_length=32,d_model=32,num_layers=2,num_heads=4,num_kv_heads=2,"
        "d_ff=48,block=prenorm,tie_embeddings=false,norm=rmsnorm(eps=1e-05),ffn=swiglu,"
        "pos=rope(theta=500000.0),attn=sdpa"
    )
    defaults = {k: v for k, v in LLAMA_V4.items() if k not in ("rope_theta", "rms_norm_eps",
                "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings")}  # fmt: skip
    spec = lmcore.parse_spec(config_to_spec(defaults))  # Llama's own defaults fill the gaps
    assert (spec.pos.kwargs["theta"], spec.norm.kwargs["eps"], spec.num_kv_heads) == (
        10000.0, 1e-6, 4,
    )  # fmt: skip
    assert (spec.context_length, spec.tie_embeddings) == (2048, False)


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
         ("rope llama3 scaling without low_freq_factor", "rope llama3 scaling without high_freq_factor")),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5e5}},
         ('rope type "yarn"', 'none ("default"), "linear" or "llama3"')),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                              "partial_rotary_factor": 0.5}},
         ("partial_rotary_factor=0.5", "this family's attention rotates every dimension")),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
         ("rope_theta=500000.0 and rope rope_theta=10000.0 disagree",)),
        ({"attention_bias": "yes"}, ('attention_bias="yes" is not true or false',)),
        ({"hidden_act": "relu"},
         ('hidden_act="relu"', '"silu" or "swish" or "gelu" or "gelu_pytorch_tanh" or "gelu_new"',
          "a gated MLP's activation")),
        ({"is_encoder_decoder": True}, ("is_encoder_decoder=true (lmcore computes false)",)),
        ({"quantization_config": {"bits": 4}, "sliding_window": 4096},
         ("fields lmcore does not know", "quantization_config, sliding_window",
          "--ignore-field NAME / ignore=[NAME]")),
        ({"vocab_size": -3}, ("vocab_size=-3 is not a positive int",)),
        ({"hidden_size": 0}, ("hidden_size=0 is not a positive int",)),
        ({"rms_norm_eps": "1e-5"}, ('rms_norm_eps="1e-5" is not a positive float',)),
        ({"tie_word_embeddings": 1}, ("tie_word_embeddings=1 is not true or false",)),
],
)  # fmt: skip
def test_what_lmcore_cannot_express_is_refused_by_name(change: dict, facts: tuple) -> None:
    with raises_naming(
        ConversionError,
        "DIR/config.json: ",
        "cannot convert this Hugging Face llama config to lmcore",
        *facts,
    ):
        config_to_spec({**LLAMA_V4, **change}, "DIR/config.json")


def test_a_family_lmcore_does_not_convert_and_an_odd_head_are_refused() -> None:
    with raises_naming(
        ConversionError,
        "DIR/config.json: ",
        "model_type 'bert' does not convert",
        "llama, mistral, qwen2, qwen3, gemma, gemma2, olmo2, phi3, gpt2, gpt_neox, mixtral, qwen3_moe",
    ):
        config_to_spec({**LLAMA_V4, "model_type": "bert"}, "DIR/config.json")
    with raises_naming(
        ConversionError,
        "DIR/config.json: ",
        "gives a spec lmcore refuses",
        "pos 'rope'",
        "head_dim = d_model / num_heads = 7 is odd",
    ):
        config_to_spec({**LLAMA_V4, "hidden_size": 30}, "DIR/config.json")


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ConversionError) as caught:
        config_to_spec({**LLAMA_V4, "attention_bias": 1, "mlp_bias": "no", "hidden_act": "relu"})
    assert str(caught.value).count(";") == 2
    for name in ("attention_bias", "mlp_bias", "hidden_act"):
        assert name in str(caught.value)


def test_a_third_party_rmsnorm_is_not_taken_for_llamas(tmp_path: Path) -> None:
    from lmcore import Component, Registry
    from lmcore_rmsnorm import RMSNorm

    registry = Registry()
    registry.add(Component(kind="norm", name="rmsnorm", build=RMSNorm), name="mine")
    with raises_naming(
        ConversionError,
        "norm=mine:rmsnorm",
        "plugin 'mine', module lmcore_rmsnorm",
        "not lmcore's built-in",
    ):
        save_llama(lmcore.build_model(f"{SMALL}, norm=mine:rmsnorm", registry=registry), tmp_path)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied matrix once


@pytest.mark.parametrize("name", FAMILIES)
def test_the_parameter_count_of_the_default_config_is_hugging_faces(name: str) -> None:
    config = AutoConfig.for_model(name)
    with torch.device("meta"):
        theirs = _count(AutoModelForCausalLM.from_config(config))
    spec = config_to_spec(config.to_dict())
    assert _count(lmcore.build_model(spec, device="meta")) == theirs


def test_fields_transformers_writes_into_every_config_are_kept_not_refused(
    tmp_path: Path,
) -> None:
    random_family_model("qwen3", tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    neutral = {"_model_name_or_path": "org/model", "unk_token_id": 3, "bos_token_id": 1,
               "transformers_version": "4.45.0", "torch_dtype": "float32"}  # fmt: skip
    path.write_text(json.dumps({**json.loads(path.read_text()), **neutral}))
    reading = read_config(json.loads(path.read_text()))
    assert {k: reading.kept[k] for k in ("_model_name_or_path", "unk_token_id")} == {
        "_model_name_or_path": "org/model", "unk_token_id": 3,
    }  # fmt: skip
    out = convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")
    back = json.loads((convert_to_hf(out, tmp_path / "back") / "config.json").read_text())
    assert (back["_model_name_or_path"], back["unk_token_id"], back["bos_token_id"]) == (
        "org/model", 3, 1,
    )  # fmt: skip


def test_an_edited_spec_is_an_ablation_qwen3_cannot_hold(tmp_path: Path) -> None:
    random_family_model("qwen3", tmp_path / "hf")
    spec = config_to_spec(json.loads((tmp_path / "hf" / "config.json").read_text()))
    assert ",qk_norm=rmsnorm(eps=1e-06)" in spec
    ablation = lmcore.build_model(spec.replace("qk_norm=rmsnorm(eps=1e-06)", "qk_norm=none"))
    assert ablation.spec.qk_norm is None
    with pytest.raises(ConversionError, match=r"qk_norm=none: a Qwen3ForCausalLM has"):
        lmcore.hf.save_hf(ablation, tmp_path / "out", model_type="qwen3")


@pytest.mark.parametrize(
    "name, change, facts",
    [
        ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
         ('rope type "longrope"', 'none ("default"), "linear" or "llama3"')),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
         ('rope type "dynamic"',)),
        ("gemma", {"use_bidirectional_attention": True},
         ("use_bidirectional_attention=true", "lmcore's attention is causal")),
        ("mixtral", {"hidden_act": "gelu"},
         ('hidden_act="gelu"', "lmcore's experts here are SwiGLU")),
        ("gpt2", {"activation_function": "quick_gelu"},
         ('activation_function="quick_gelu"', 'lmcore expresses "gelu" or "gelu_new"')),
        ("qwen2", {"layer_types": ["full_attention"]},
         ('layer_types=["full_attention"]', 'a list of 2 "sliding_attention" or "full_attention"')),
        ("gpt_neox", {"use_parallel_residual": "yes"},
         ('use_parallel_residual="yes"', "lmcore expresses true or false")),
        ("qwen3_moe", {"mlp_only_layers": "all"},
         ('mlp_only_layers="all" is not a list of layer indices',)),
        ("mamba2", {"hidden_act": "gelu"},
         ('hidden_act="gelu"', "lmcore's mamba2 applies silu after the conv")),
        ("mamba2", {"time_step_limit": [0.0, 0.1]},
         ("time_step_limit=[0.0, 0.1]", "clamps dt to nothing", "(0.0, inf)")),
        ("mamba2", {"num_heads": 64},
         ("num_heads=64 and head_dim=64 split 4,096 channels",
          "not expand · hidden_size = 2 · 4096 = 8,192")),
        ("mamba2", {"residual_in_fp32": "yes"}, ('residual_in_fp32="yes" is not true or false',)),
        ("falcon_h1", {"mamba_n_heads": 100, "mamba_d_head": 8},
         ("mamba_n_heads=100 heads of mamba_d_head=8 are 800 channels, not the inner width 1,024",)),
        ("falcon_h1", {"ssm_multipliers": [1.0, 2.0]},
         ("ssm_multipliers=[1.0, 2.0] is not a list of 5 numbers",)),
        ("falcon_h1", {"mlp_multipliers": [1.0, "x"]}, ('mlp_multipliers[1]="x" is not a positive float',)),
        ("falcon_h1", {"hidden_act": "gelu"}, ('hidden_act="gelu"', "its conv applies silu")),
        ("falcon_h1", {"time_step_limit": [0.001, 0.1]}, ("time_step_limit=[0.001, 0.1]",)),
],
)  # fmt: skip
def test_what_a_family_cannot_express_is_refused_by_name(
    name: str, change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    config = {**AutoConfig.for_model(name, num_hidden_layers=2).to_dict(), **change}
    with raises_naming(
        ConversionError,
        "DIR/config.json: ",
        f"cannot convert this Hugging Face {name} config to lmcore",
        *facts,
    ):
        config_to_spec(config, "DIR/config.json")


def test_without_model_type_the_architectures_name_the_family_or_it_is_refused() -> None:
    """A config without model_type is read by `architectures` when they name one family lmcore
    converts, never assumed to be a Llama (issue 32)."""
    bare = {k: v for k, v in LLAMA_V4.items() if k != "model_type"}
    assert config_to_spec(bare) == config_to_spec(LLAMA_V4)  # LlamaForCausalLM: a Llama
    for archs in (None, [], ["BertForMaskedLM"], "LlamaForCausalLM"):  # a string is not a list
        with raises_naming(
            ConversionError, "DIR/config.json", "has no model_type", "llama, mistral",
            "MistralForCausalLM (mistral)", 'add "model_type"',
        ):  # fmt: skip
            config_to_spec({**bare, "architectures": archs}, "DIR/config.json")
    with raises_naming(ConversionError, "names 2 families (llama, mistral)", 'add "model_type"'):
        config_to_spec({**bare, "architectures": ["MistralForCausalLM", "LlamaForCausalLM"]})


def test_a_mamba2_config_is_layers_of_a_norm_and_the_mixer_alone(tmp_path: Path) -> None:
    """No feed-forward sub-layer (`ffn=none`: no ln2, nothing counted), no positions; its
    residual_in_fp32 noted (the same in float32), its time_step_limit as transformers saves it."""
    config = AutoConfig.for_model("mamba2", num_hidden_layers=2, residual_in_fp32=True)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
    reading = read_config(saved)
    spec = lmcore.parse_spec(reading.spec)
    assert (str(spec.ffn), spec.pos.name, spec.mixer.name, spec.context_length) == (
        "none", "nope", "mamba2", 2048,
    )  # fmt: skip
    assert any("residual_in_fp32=true" in n and "the same in float32" in n for n in reading.notes)
    model = lmcore.build_model(reading.spec, device="meta")
    assert not [k for k in model.state_dict() if ".ln2" in k or ".ffn." in k]
    longer = read_config({**saved, "max_position_embeddings": 65536}).spec
    assert lmcore.parse_spec(longer).context_length == 65536


def test_a_model_mamba2_cannot_hold_is_refused_by_name(tmp_path: Path) -> None:
    spec = ("vocab_size=97, context_length=2048, d_model=32, num_layers=2, num_heads=8, "
            "head_dim=8, ffn=none, pos=nope, mixer=mamba2(d_state=8, n_groups=2)")  # fmt: skip
    with_ffn = lmcore.build_model(spec.replace("ffn=none", "ffn=swiglu"))
    with pytest.raises(ConversionError, match=r"ffn=swiglu: a Mamba2ForCausalLM has ffn=none"):
        lmcore.hf.save_hf(with_ffn, tmp_path / "a", model_type="mamba2")
    odd_heads = lmcore.build_model(spec.replace("num_heads=8, head_dim=8", "num_heads=4"))
    with raises_naming(ConversionError, "num_heads=4 and head_dim=8 split 32 channels"):
        lmcore.hf.save_hf(odd_heads, tmp_path / "b", model_type="mamba2")
    assert lmcore.hf.save_hf(lmcore.build_model(spec), tmp_path / "c", model_type="mamba2")


def test_falcon_h1s_multipliers_are_spec_arguments_other_families_refuse(tmp_path: Path) -> None:
    """None is folded into a weight: a Llama cannot hold Falcon-H1's logit scale or MLP scales,
    and says so by name."""
    spec = config_to_spec(
        AutoConfig.for_model("falcon_h1", num_hidden_layers=2, lm_head_multiplier=0.5,
                             mlp_multipliers=[2.0, 0.25], key_multiplier=2.0).to_dict()
    )  # fmt: skip
    assert "logit_scale=0.5" in spec and "ffn=swiglu(w1_scale=2.0,w2_scale=0.25)" in spec
    assert lmcore.parse_spec(spec).query_scale == 2.0 / 128**0.5  # key_multiplier / sqrt(128)
    llama = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4"
    with raises_naming(ConversionError, "logit_scale=0.5: a LlamaForCausalLM has logit_scale=1.0",
                       "ffn=swiglu(w1_scale=2.0): a LlamaForCausalLM has ffn=swiglu"):  # fmt: skip
        lmcore.hf.save_hf(
            lmcore.build_model(f"{llama}, logit_scale=0.5, ffn=swiglu(w1_scale=2.0)"),
            tmp_path / "out", model_type="llama",
        )
