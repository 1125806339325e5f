"""Every Hugging Face family lmcore converts, against transformers' own modeling code: a tiny
random model (every weight, norm gains and biases included, perturbed) gives the same logits in
lmcore, the same logits again once converted back, and the same greedy tokens through lmcore's
KV cache as `generate`; the parameter count of each family's default config (a real model's
shape) is Hugging Face's own, counted on the meta device on both sides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore.cli.main import main
from lmcore.hf import FAMILIES, config_to_spec, convert_from_hf, convert_to_hf, read_config
from lmcore.model.generate import GREEDY

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TOLERANCE = 1e-4  # max abs logit difference, float32
VOCAB = 97
SIZES: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}  # fmt: skip
# One tiny config per family, each using what sets the family apart.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(SIZES, rope_scaling=LLAMA3, rope_theta=500.0),
    "mistral": dict(SIZES, sliding_window=6),
    "qwen2": dict(SIZES, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    "qwen3": dict(SIZES, head_dim=16, tie_word_embeddings=True),
    "gemma": dict(SIZES, head_dim=8),
    "gemma2": dict(SIZES, head_dim=8, sliding_window=6, query_pre_attn_scalar=8,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    "olmo2": dict(SIZES),
    "phi3": dict(SIZES, partial_rotary_factor=0.5, pad_token_id=0),
    "gpt2": dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                 scale_attn_by_inverse_layer_idx=True),
    "gpt_neox": dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5),
    "mixtral": dict(SIZES, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      head_dim=8, norm_topk_prob=True, mlp_only_layers=[1]),
}  # fmt: skip


def random_model(name: str, directory: Path) -> Any:
    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **CONFIGS[name])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))  # norm gains and biases too, so they matter
    model.save_pretrained(directory)
    return model


def test_every_family_has_a_case() -> None:
    assert sorted(CONFIGS) == sorted(FAMILIES)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_converts_both_ways_exactly(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = random_model(name, tmp_path / "hf")
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = reference(ids).logits
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(out)]) == 0
    ours = lmcore.load(out).eval()
    with torch.no_grad():
        got = ours(ids)
    assert (got - expected).abs().max() <= TOLERANCE

    assert main(["convert", "--to-hf", str(out), str(tmp_path / "back")]) == 0
    back, info = AutoModelForCausalLM.from_pretrained(
        tmp_path / "back", attn_implementation="eager", output_loading_info=True
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    with torch.no_grad():
        assert (back.eval()(ids).logits - got).abs().max() <= TOLERANCE
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == name

    prompt = ids[0, :5]
    theirs = reference.generate(prompt[None], max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 12, GREEDY), theirs[0, 5:])
    capsys.readouterr()
    argv = ["generate", str(out), "--prompt-ids", ",".join(map(str, prompt.tolist())),
            "--temperature", "0", "--max-new-tokens", "12"]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out.split() == [str(i) for i in theirs[0, 5:].tolist()]


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied matrix once


@pytest.mark.parametrize("name", FAMILIES)
def test_the_parameter_count_of_the_default_config_is_hugging_faces(name: str) -> None:
    config = AutoConfig.for_model(name)
    with torch.device("meta"):
        theirs = _count(AutoModelForCausalLM.from_config(config))
    spec = config_to_spec(config.to_dict())
    assert _count(lmcore.build_model(spec, device="meta")) == theirs


@pytest.mark.parametrize(
    "config, count", [("MixtralConfig", "46,702,792,704"), ("GPT2Config", "124,439,808")]
)
def test_describe_build_and_print_spec_read_a_config(
    config: str, count: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    getattr(transformers, config)().save_pretrained(tmp_path)
    assert main(["describe", str(tmp_path)]) == 0
    assert f"total {count}" in " ".join(capsys.readouterr().out.split())
    assert main(["build", str(tmp_path / "config.json"), "--device", "meta"]) == 0
    assert f"parameters: {count}" in capsys.readouterr().out
    assert main(["convert", "--from-hf", str(tmp_path), "--print-spec"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(lmcore.parse_spec(printed))
    assert not list(tmp_path.glob("*.safetensors"))


def test_fields_transformers_writes_into_every_config_are_kept_not_refused(
    tmp_path: Path,
) -> None:
    random_model("qwen3", tmp_path / "hf")
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
    random_model("qwen3", tmp_path / "hf")
    spec = config_to_spec(json.loads((tmp_path / "hf" / "config.json").read_text()))
    assert ",qk_norm=rmsnorm(eps=1e-06)" in spec
    ablation = lmcore.build_model(spec.replace("qk_norm=rmsnorm(eps=1e-06)", "qk_norm=none"))
    assert ablation.spec.qk_norm is None
    with pytest.raises(lmcore.ConversionError, match=r"qk_norm=none: a Qwen3ForCausalLM has"):
        lmcore.hf.save_hf(ablation, tmp_path / "out", model_type="qwen3")


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
         r'rope type "longrope": lmcore\'s rope scales frequencies by none \("default"\), '
         r'"linear" or "llama3"'),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
         r'rope type "dynamic"'),
        ("gemma", {"use_bidirectional_attention": True},
         r"use_bidirectional_attention=true \(lmcore's attention is causal\)"),
        ("mixtral", {"hidden_act": "gelu"},
         r'hidden_act="gelu" \(lmcore\'s experts here are SwiGLU\)'),
        ("gpt2", {"activation_function": "quick_gelu"},
         r'activation_function="quick_gelu": lmcore expresses "gelu" or "gelu_new"'),
        ("qwen2", {"layer_types": ["full_attention"]},
         r'layer_types=\["full_attention"\]: lmcore reads a list of 2 "sliding_attention" or '
         r'"full_attention"'),
        ("gpt_neox", {"use_parallel_residual": "yes"},
         r'use_parallel_residual="yes": lmcore expresses true or false'),
        ("qwen3_moe", {"mlp_only_layers": "all"},
         r'mlp_only_layers="all" is not a list of layer indices'),
    ],
)  # fmt: skip
def test_what_a_family_cannot_express_is_refused_by_name(
    name: str, change: dict[str, Any], message: str
) -> None:
    config = {**AutoConfig.for_model(name, num_hidden_layers=2).to_dict(), **change}
    with pytest.raises(
        lmcore.ConversionError,
        match=rf"DIR/config.json: cannot convert this Hugging Face {name} config to lmcore "
        r"without losing something: " + message,
    ):
        config_to_spec(config, "DIR/config.json")
