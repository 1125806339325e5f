"""gpt-oss (`lmcore.hf.gpt_oss`): its experts' stacked tensors split and stacked again as
transformers lays them out, what a gpt-oss config holds that lmcore cannot express and what an
lmcore model holds that gpt-oss cannot, both refused by name. Converted both ways against
transformers: tests/cli/test_convert_hf_families.py; its default count: tests/hf/test_family.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore import ConversionError
from lmcore.hf import config_to_spec, save_hf
from lmcore.hf.weights import Experts, Rotation
from tests.helpers.errors import raises_naming
from tests.helpers.hf import FAMILY_CONFIGS, quiet_transformers

transformers = quiet_transformers()
from transformers import AutoConfig  # noqa: E402

NONE = Rotation(8, 0)


def test_the_experts_layout_is_transformers_interleaved_transposed_stack() -> None:
    gate_up = torch.randn(3, 5, 8)  # (E, d_model, 2·d_ff) as GptOssExperts holds it
    layout = Experts(2, interleaved=True, transpose=True)
    shapes = [(4, 5)] * 6  # w1, w3 of experts 0, 1, 2
    assert layout.hf_shape(shapes) == (3, 5, 8)
    parts = layout.split(gate_up, shapes, NONE)
    for e in range(3):  # transformers: gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        assert torch.equal(parts[2 * e], gate_up[e][:, ::2].T)
        assert torch.equal(parts[2 * e + 1], gate_up[e][:, 1::2].T)
    assert torch.equal(layout.join(parts, NONE), gate_up)
    bias = torch.randn(3, 8)
    b_parts = Experts(2, interleaved=True).split(bias, [(4,)] * 6, NONE)
    assert torch.equal(b_parts[3], bias[1][1::2])
    assert torch.equal(Experts(2, interleaved=True).join(b_parts, NONE), bias)
    down = torch.randn(3, 4, 5)  # (E, d_ff, d_model): w2 (d_model, d_ff) transposed
    d_parts = Experts(transpose=True).split(down, [(5, 4)] * 3, NONE)
    assert torch.equal(d_parts[2], down[2].T)
    assert torch.equal(Experts(transpose=True).join(d_parts, NONE), down)


@pytest.mark.parametrize(
    "change, facts",
    [
        ({"swiglu_limit": -1.0}, ("swiglu_limit=-1.0 is not a positive float",)),
        ({"swiglu_alpha": "1.702"}, ('swiglu_alpha="1.702" is not a positive float',)),
        ({"layer_types": ["full_attention"]},
         ('layer_types=["full_attention"]', 'a list of 2 "sliding_attention" or "full_attention"')),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
         ('rope type "longrope"',)),
        ({"attention_bias": "yes"}, ('attention_bias="yes" is not true or false',)),
        ({"quantization_config": {"quant_method": "mxfp4"}},
         ("fields lmcore does not know", "quantization_config")),
    ],
)  # fmt: skip
def test_what_lmcore_cannot_express_is_refused_by_name(
    change: dict[str, Any], facts: tuple[str, ...]
) -> None:
    config = {**AutoConfig.for_model("gpt_oss", **FAMILY_CONFIGS["gpt_oss"]).to_dict(), **change}
    with raises_naming(
        ConversionError,
        "DIR/config.json: ",
        "cannot convert this Hugging Face gpt_oss config to lmcore",
        *facts,
    ):
        config_to_spec(config, "DIR/config.json")


def test_more_experts_per_token_than_experts_is_refused_by_the_spec() -> None:
    config = AutoConfig.for_model("gpt_oss", **FAMILY_CONFIGS["gpt_oss"]).to_dict()
    with raises_naming(
        ConversionError, "gives a spec lmcore refuses", "top_k=5 exceeds num_experts=4"
    ):
        config_to_spec({**config, "num_experts_per_tok": 5}, "DIR/config.json")


GPT_OSS = (
    "vocab_size=97, context_length=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, "
    "head_dim=16, d_ff=48, qkv_bias=true, out_bias=true, attn_sinks=true, window[0]=6, "
    "pos=rope(theta=500.0), norm=rmsnorm(eps=1e-5), ffn=moe(num_experts=4, top_k=2, "
    "softmax=after, router_bias=true, aux_loss_coef=0.0, expert=clamped_swiglu(bias=true))"
)


@pytest.mark.parametrize(
    "old, new, facts",
    [
        ("softmax=after", "softmax=before", ("softmax=before", "a GptOssForCausalLM has",
                                             "softmax=after")),
        ("expert=clamped_swiglu(bias=true)", "expert=swiglu",
         ("expert=swiglu", "expert=clamped_swiglu(alpha=1.702,limit=7.0,bias=true)")),
        ("clamped_swiglu(bias=true)", "clamped_swiglu", ("bias=false",)),
        ("router_bias=true", "router_bias=false",
         ("a GptOssForCausalLM has ffn=moe(", "router_bias=true")),
        ("attn_sinks=true", "attn_sinks=false",
         ("attn_sinks=false: a GptOssForCausalLM has attn_sinks=true",)),
        ("out_bias=true", "out_bias=false",  # one attention_bias for both
         ("out_bias=false: a GptOssForCausalLM has out_bias=true",)),
    ],
)  # fmt: skip
def test_what_gpt_oss_cannot_hold_is_refused_by_name(
    old: str, new: str, facts: tuple[str, ...], tmp_path: Path
) -> None:
    save_hf(lmcore.build_model(GPT_OSS), tmp_path / "ok", model_type="gpt_oss")  # as it is: fine
    assert old in GPT_OSS
    model = lmcore.build_model(GPT_OSS.replace(old, new))
    with raises_naming(ConversionError, "GptOssForCausalLM without losing something", *facts):
        save_hf(model, tmp_path / "out", model_type="gpt_oss")


def test_no_rotary_parameters_is_gpt_oss_yarn_and_a_plain_rope_is_written_default(
    tmp_path: Path,
) -> None:
    """GptOssConfig fills in YaRN (factor 32 over 4,096 positions, untruncated) when a config
    gives no rotary parameters; so a rope without scaling is written as "default", not null."""
    config = AutoConfig.for_model("gpt_oss", **FAMILY_CONFIGS["gpt_oss"]).to_dict()
    bare = {k: v for k, v in config.items() if k not in ("rope_parameters", "rope_scaling")}
    yarn = "scaling=yarn,factor=32.0,original_context_length=4096,truncate=false"
    assert f"pos=rope(theta=150000.0,{yarn})" in config_to_spec(bare)
    assert config_to_spec({**bare, "rope_parameters": None}) == config_to_spec(bare)
    plain = GPT_OSS  # pos=rope(theta=500.0): no scaling
    out = save_hf(lmcore.build_model(plain), tmp_path / "plain", model_type="gpt_oss")
    written = transformers.GptOssConfig.from_pretrained(out)
    assert written.rope_parameters["rope_type"] == "default"
    assert written.rope_parameters["rope_theta"] == 500.0
