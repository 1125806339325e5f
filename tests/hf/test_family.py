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
from lmcore.blueprint import resolve
from lmcore.hf import (
    FAMILIES,
    config_to_spec,
    convert_from_hf,
    convert_to_hf,
    read_config,
    save_llama,
    spec_to_config,
)
from tests.helpers.errors import raises_naming
from tests.helpers.hf import FAMILY_CONFIGS, LLAMA_V4, quiet_transformers, random_family_model
from tests.helpers.hf import HF_SPEC as SMALL

transformers = quiet_transformers()
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 16,
         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16,
         "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16.0},
    ],
)
def test_yarn_rope_parameters_read_into_the_spec_and_write_back(rope: dict[str, Any]) -> None:
    config = {**LLAMA_V4, "rope_scaling": rope}
    spec = lmcore.parse_spec(config_to_spec(config))
    args = spec.pos.kwargs
    assert args["scaling"] == "yarn" and args["factor"] == rope["factor"]
    assert args["original_context_length"] == 16
    assert args.get("truncate", True) is rope.get("truncate", True)
    assert args.get("mscale_all_dim", 0.0) == rope.get("mscale_all_dim", 0.0)
    back = spec_to_config(resolve(spec), torch.float32, {"model_type": "llama"})
    wanted = {k: v for k, v in rope.items() if (k, v) not in (("beta_fast", 32.0),
              ("beta_slow", 1.0), ("truncate", True))}  # fmt: skip
    assert back["rope_scaling"] == wanted


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
         ("rope yarn scaling without original_max_position_embeddings",)),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5e5,
                              "original_max_position_embeddings": 16, "truncate": "no"}},
         ('rope_parameters.truncate="no" is not true or false',)),
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


# DeepSeek-V3's own rope_scaling (its config.json on the Hub), as transformers 5 standardises it.
_DS_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32,
            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096}  # fmt: skip


@pytest.mark.parametrize(
    "name, change, facts",
    [
        ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
         ('rope type "longrope"', 'none ("default"), "linear", "llama3" or "yarn"')),
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
        ("deepseek_v3", {"num_key_value_heads": 16},
         ("num_key_value_heads=16", "each of the num_attention_heads=128 heads its own keys")),
        ("deepseek_v3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
         ('rope type "longrope"', 'without scaling ("default") or with "yarn"')),
        ("deepseek_v3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
         ("rope yarn scaling without factor",)),
        ("deepseek_v3", {"rope_parameters": {**_DS_YARN, "truncate": False}},
         ("rope truncate=false", "truncate: true")),
        ("deepseek_v3", {"rope_parameters": {**_DS_YARN, "partial_rotary_factor": 0.5}},
         ("partial_rotary_factor=0.5", "rotates all qk_rope_head_dim dimensions")),
        ("deepseek_v3", {"rope_parameters": {**_DS_YARN, "low_freq_factor": 1.0}},
         ("rope parameters low_freq_factor=1.0", '"yarn" rotation reads none of them')),
        ("deepseek_v3", {"moe_layer_freq": 2},
         ("moe_layer_freq=2", "every layer from first_k_dense_replace on a mixture of experts")),
        ("deepseek_v3", {"scoring_func": "softmax"},
         ('scoring_func="softmax"', "routes by sigmoid")),
        ("deepseek_v3", {"hidden_act": "gelu"},
         ('hidden_act="gelu"', "lmcore's experts here are SwiGLU")),
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


@pytest.mark.parametrize(
    ("activation", "approximate"), [("gelu", "none"), ("gelu_pytorch_tanh", "tanh")]
)
def test_gemma2_reads_hidden_activation_as_transformers_does_and_leaves_hidden_act(
    activation: str, approximate: str, tmp_path: Path
) -> None:
    """Gemma 2's MLP is `ACT2FN[hidden_activation]` (exact GELU for "gelu", unlike Gemma's
    legacy remapping); `hidden_act`, which released configs also hold, is never read."""
    config = AutoConfig.for_model("gemma2", **FAMILY_CONFIGS["gemma2"],
                                  hidden_activation=activation)  # fmt: skip
    config.hidden_act = "silu"
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    reference.save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["hidden_act"] == "silu"
    spec = lmcore.parse_spec(config_to_spec(saved))
    assert (spec.ffn.name, spec.ffn.kwargs.get("approximate", "none")) == ("geglu", approximate)
    convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = lmcore.load(tmp_path / "m.safetensors").eval()(ids) - reference(ids).logits
    assert diff.abs().max() <= 1e-4


# DeepSeek-V3's config.json on the Hub (deepseek-ai/DeepSeek-V3), less its fp8
# quantization_config: the fields of DeepSeek's own code that transformers never reads.
DEEPSEEK_V3_HUB = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip


def test_deepseek_v3s_own_config_reads_and_its_quantization_is_refused() -> None:
    spec = config_to_spec(DEEPSEEK_V3_HUB)
    for part in (
        "context_length=163840", "d_model=7168", "num_layers=61", "num_heads=128",
        "d_ff=2048", "d_ff[0:3]=18432", "ffn=swiglu,ffn[3:]=moe(", "pos=nope",
        "mixer=mla(kv_lora_rank=512,q_lora_rank=1536,qk_nope_head_dim=128,qk_rope_head_dim=64,"
        "v_head_dim=128,rope_theta=10000.0,rope_interleave=true,eps=1e-06,scaling=yarn,"
        "factor=40.0,original_context_length=4096,mscale=1.0,mscale_all_dim=1.0)",
        "num_experts=256", "top_k=8", "renormalize=true", "shared=swiglu(d_ff=2048)",
        "score=sigmoid", "n_group=8", "topk_group=4", "score_bias=true", "scale=2.5",
    ):  # fmt: skip
        assert part in spec, part
    fp8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"}
    with raises_naming(ConversionError, "fields lmcore does not know", "quantization_config"):
        config_to_spec({**DEEPSEEK_V3_HUB, "quantization_config": fp8})


def test_a_latent_attention_model_deepseek_v3_cannot_hold_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """The spec of a DeepSeek-V3 with one word changed: converting it back names that word."""
    random_family_model("deepseek_v3", tmp_path / "hf")
    spec = config_to_spec(json.loads((tmp_path / "hf" / "config.json").read_text()))
    for before, after, fact in (
        ("pos=nope", "pos=rope", "pos=rope(theta=10000.0): a DeepseekV3ForCausalLM has pos=nope"),
        ("score_bias=true,", "", "a DeepseekV3ForCausalLM has ffn=swiglu, ffn[1:]=moe("),
        ("block=prenorm", "block=postnorm", "block=postnorm"),
    ):
        assert before in spec
        model = lmcore.build_model(spec.replace(before, after), device="meta")
        with raises_naming(ConversionError, "DeepseekV3ForCausalLM without losing", fact):
            lmcore.hf.save_hf(model, tmp_path / "out", model_type="deepseek_v3")


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
