"""Hugging Face Llama interop against transformers itself (a test-only dependency): random
`LlamaForCausalLM`s saved with `save_pretrained` (sharded too), converted, compared by logits,
converted back and loaded with `from_pretrained`. No network.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmcore
from lmcore import ConversionError
from lmcore.cli.main import main
from lmcore.hf import (
    config_to_spec,
    convert_from_hf,
    convert_to_hf,
    load_llama,
    permute_from_hf,
    permute_to_hf,
    save_llama,
)

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SMALL = "vocab_size=97, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=48"
TOLERANCE = 1e-5  # max abs logit difference, float32


def random_llama(
    directory: Path, *, kv_heads: int = 2, tie: bool = False, shard: bool = False, **config
) -> LlamaForCausalLM:
    """A small random Llama, every weight perturbed (RMSNorm gains too), saved to `directory`."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=tie, **config,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory, max_shard_size="20KB" if shard else "5GB")
    return model


def tokens(vocab: int = 97, seq: int = 32) -> torch.Tensor:
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(3))


def hf_logits(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def lm_logits(model: lmcore.TransformerLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize(
    "kv_heads, tie, shard",
    [(4, False, False), (2, False, True), (1, True, True), (2, True, False)],
    ids=["mha", "gqa-sharded", "mqa-tied-sharded", "gqa-tied"],
)
def test_from_hf_and_back_through_the_command_line(
    tmp_path: Path, kv_heads: int, tie: bool, shard: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "hf"
    reference = random_llama(source, kv_heads=kv_heads, tie=tie, shard=shard)
    if shard:
        assert len(list(source.glob("model-*.safetensors"))) > 2
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(source), str(out)]) == 0
    spec = f"{SMALL}, num_kv_heads={kv_heads}, tie_embeddings={str(tie).lower()}, "
    spec += "norm=rmsnorm(eps=1e-5), pos=rope(theta=500)"
    assert capsys.readouterr().out.splitlines()[0] == f"spec: {lmcore.parse_spec(spec)}"

    ours = lmcore.load(out)
    ids = tokens()
    expected = hf_logits(reference, ids)
    assert (lm_logits(ours, ids) - expected).abs().max() <= TOLERANCE
    assert (ours.lm_head.weight is ours.token_embeddings.weight) == tie

    back_dir = tmp_path / "back"
    assert main(["convert", "--to-hf", str(out), str(back_dir)]) == 0
    assert "LlamaForCausalLM.from_pretrained loads it" in capsys.readouterr().out
    back, info = LlamaForCausalLM.from_pretrained(back_dir, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    back.eval()
    # The exact weights went there and back: the Hugging Face logits are the same numbers.
    assert torch.equal(hf_logits(back, ids), expected)
    assert (hf_logits(back, ids) - lm_logits(ours, ids)).abs().max() <= TOLERANCE


def test_the_source_configs_passive_fields_come_back(tmp_path: Path) -> None:
    random_llama(tmp_path / "hf", bos_token_id=5, eos_token_id=6, initializer_range=0.01)
    out = convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")
    kept = json.loads(lmcore.read_info(out).metadata["hf.config"])
    assert kept["bos_token_id"] == 5
    convert_to_hf(out, tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["initializer_range"]) == (
        5, 6, 0.01,
    )  # fmt: skip
    assert config["rope_theta"] == 500.0 and config["rope_scaling"] is None
    assert "transformers_version" not in config  # lmcore wrote this file, not transformers


@pytest.mark.parametrize(
    "spec",
    [
        f"{SMALL}, num_kv_heads=2",
        f"{SMALL}, tie_embeddings=true, attn=chunked(block_size=8)",
        f"{SMALL}, num_kv_heads=1, norm=rmsnorm(eps=1e-6), pos=rope(theta=10000)",
    ],
)
def test_an_lmcore_model_goes_to_hf_and_gives_the_same_logits(spec: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    ours = lmcore.build_model(spec)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_llama(ours, tmp_path / "hf")
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = tokens()
    assert (hf_logits(theirs, ids) - lm_logits(ours, ids)).abs().max() <= TOLERANCE
    again = load_llama(tmp_path / "hf")  # attn=sdpa: the kernel is lmcore's choice, not Llama's
    assert str(again.spec) == str(ours.spec).replace("attn=chunked(block_size=8)", "attn=sdpa")
    mine, back = ours.state_dict(), again.state_dict()
    assert mine.keys() == back.keys() and all(torch.equal(mine[k], back[k]) for k in mine)


def test_bfloat16_weights_keep_their_dtype_unless_asked(tmp_path: Path) -> None:
    reference = random_llama(tmp_path / "f32")
    reference.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    kept = convert_from_hf(tmp_path / "bf16", tmp_path / "bf16.safetensors")
    assert lmcore.read_info(kept).dtype == "bfloat16"
    assert main(["convert", "--from-hf", str(tmp_path / "bf16"), str(tmp_path / "f32.safetensors"),
                 "--dtype", "float32"]) == 0  # fmt: skip
    wide = lmcore.load(tmp_path / "f32.safetensors")
    assert wide.lm_head.weight.dtype == torch.float32
    assert torch.equal(wide.lm_head.weight, reference.lm_head.weight.float())


def test_the_rotary_permutation_keeps_every_attention_score() -> None:
    """q·k after Hugging Face's rotate_half RoPE on HF-layout projections equals q·k after
    lmcore's interleaved RoPE on the permuted projections, at every pair of positions."""
    from lmcore_rope import RotaryPositionalEmbedding

    torch.manual_seed(0)
    heads, kv_heads, d, d_model, seq = 4, 2, 8, 32, 12
    wq, wk = torch.randn(heads * d, d_model), torch.randn(kv_heads * d, d_model)
    x = torch.randn(1, seq, d_model)
    positions = torch.arange(seq)[None]

    def split(t: torch.Tensor, h: int) -> torch.Tensor:
        return t.view(1, seq, h, d).transpose(1, 2)  # (B, H, T, D)

    config = LlamaConfig(hidden_size=d_model, num_attention_heads=heads, rope_theta=500.0,
                         max_position_embeddings=seq)  # fmt: skip
    cos, sin = modeling_llama.LlamaRotaryEmbedding(config=config)(x, positions)
    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(
        split(x @ wq.T, heads), split(x @ wk.T, kv_heads), cos, sin
    )
    rope = RotaryPositionalEmbedding(500.0, d, seq)
    q_ours = rope(split(x @ permute_from_hf(wq, heads).T, heads), positions)
    k_ours = rope(split(x @ permute_from_hf(wk, kv_heads).T, kv_heads), positions)
    scores_hf = q_hf @ k_hf.repeat_interleave(2, dim=1).transpose(-1, -2)
    scores_ours = q_ours @ k_ours.repeat_interleave(2, dim=1).transpose(-1, -2)
    assert torch.allclose(scores_ours, scores_hf, atol=1e-4, rtol=1e-5)
    assert torch.equal(permute_to_hf(permute_from_hf(wq, heads), heads), wq)
    # Row 2i + 1 of a head is Hugging Face's row i + D/2.
    assert torch.equal(permute_from_hf(wq, heads)[d + 3], wq[d + 1 + d // 2])


# ------------------------------------------------------------------ what does not carry over

LLAMA_V4 = {  # a transformers 4 config.json
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2, "pretraining_tp": 1, "transformers_version": "4.45.0",
}  # fmt: skip


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
    "change, message",
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
         r"rope llama3 scaling without low_freq_factor; rope llama3 scaling without "
         r"high_freq_factor"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5e5}},
         r'rope type "yarn": lmcore\'s rope scales frequencies by none \("default"\), "linear" '
         r'or "llama3"'),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                              "partial_rotary_factor": 0.5}},
         r"partial_rotary_factor=0.5: this family's attention rotates every dimension"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
         r"rope_theta=500000.0 and rope rope_theta=10000.0 disagree"),
        ({"attention_bias": "yes"}, r'attention_bias="yes" is not true or false'),
        ({"hidden_act": "relu"},
         r'hidden_act="relu": lmcore expresses "silu" or "swish" or "gelu" or '
         r'"gelu_pytorch_tanh" or "gelu_new" \(a gated MLP\'s activation\)'),
        ({"is_encoder_decoder": True}, r"is_encoder_decoder=true \(lmcore computes false\)"),
        ({"quantization_config": {"bits": 4}, "sliding_window": 4096},
         r"fields lmcore does not know, which may change the model: quantization_config, "
         r"sliding_window \(if you know that one does not, e.g. because transformers' "
         r"LlamaForCausalLM never reads it, pass --ignore-field NAME / ignore=\[NAME\]\)"),
        ({"vocab_size": -3}, r"vocab_size=-3 is not a positive int"),
        ({"hidden_size": 0}, r"hidden_size=0 is not a positive int"),
        ({"rms_norm_eps": "1e-5"}, r'rms_norm_eps="1e-5" is not a positive float'),
        ({"tie_word_embeddings": 1}, r"tie_word_embeddings=1 is not true or false"),
    ],
)  # fmt: skip
def test_what_lmcore_cannot_express_is_refused_by_name(change: dict, message: str) -> None:
    with pytest.raises(
        ConversionError,
        match=r"DIR/config.json: cannot convert this Hugging Face llama config to lmcore "
        r"without losing something: .*" + message,
    ):
        config_to_spec({**LLAMA_V4, **change}, "DIR/config.json")


def test_a_family_lmcore_does_not_convert_and_an_odd_head_are_refused() -> None:
    with pytest.raises(
        ConversionError,
        match=r"DIR/config.json: model_type 'bert' does not convert to lmcore; the families "
        r"that do: llama, mistral, qwen2, qwen3, gemma, gemma2, olmo2, phi3, gpt2, gpt_neox, "
        r"mixtral, qwen3_moe",
    ):
        config_to_spec({**LLAMA_V4, "model_type": "bert"}, "DIR/config.json")
    with pytest.raises(
        ConversionError,
        match=r"DIR/config.json: its llama config gives a spec lmcore refuses: pos 'rope': RoPE "
        r"rotates pairs of dimensions, but head_dim = d_model / num_heads = 7 is odd",
    ):
        config_to_spec({**LLAMA_V4, "hidden_size": 30}, "DIR/config.json")


def test_a_field_known_not_to_matter_can_be_ignored(tmp_path: Path, capsys) -> None:
    config = {**LLAMA_V4, "rope_interleaved": False, "is_llama_config": True}
    with pytest.raises(ConversionError, match=r"not know.*: is_llama_config, rope_interleaved"):
        config_to_spec(config)
    spec = config_to_spec(config, ignore=["rope_interleaved", "is_llama_config"])
    assert spec == config_to_spec(LLAMA_V4)
    random_llama(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rope_interleaved": False}))
    out = str(tmp_path / "m.safetensors")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), out]) == 2
    assert "rope_interleaved (if you know" in capsys.readouterr().err
    argv = ["convert", "--from-hf", str(tmp_path / "hf"), out, "--ignore-field", "rope_interleaved"]
    assert main(argv) == 0
    assert '"rope_interleaved": false' in lmcore.read_info(out).metadata["hf.config"]
    assert main(["convert", "--to-hf", out, str(tmp_path / "back"), "--ignore-field", "x"]) == 2
    assert "--dtype, --ignore-field and --print-spec apply to --from-hf only" in (
        capsys.readouterr().err
    )


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ConversionError) as caught:
        config_to_spec({**LLAMA_V4, "attention_bias": 1, "mlp_bias": "no", "hidden_act": "relu"})
    assert str(caught.value).count(";") == 2
    for name in ("attention_bias", "mlp_bias", "hidden_act"):
        assert name in str(caught.value)


def test_a_refused_directory_writes_nothing(tmp_path: Path, capsys) -> None:
    random_llama(tmp_path / "hf", rope_parameters={"rope_type": "yarn", "factor": 2.0,
                                                  "rope_theta": 500.0})  # fmt: skip
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), str(out)]) == 2
    assert 'rope type "yarn"' in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ("block=postnorm", r"block=postnorm: a LlamaForCausalLM has block=prenorm"),
        ("pos=alibi", r"pos=alibi: a LlamaForCausalLM has pos=rope\(theta=10000.0\)"),
        ("pos=nope", r"pos=nope: a LlamaForCausalLM has pos=rope"),
        ("pos=learned", r"pos=learned: a LlamaForCausalLM has pos=rope"),
        ("norm=layernorm", r"norm=layernorm\(bias=true,eps=1e-05\): a LlamaForCausalLM has "
         r"norm=rmsnorm\(eps=1e-05\)"),
        ("ffn=gelu", r"ffn=gelu: a LlamaForCausalLM has ffn=swiglu"),
        ("window=4", r"window=4: a LlamaForCausalLM has window=0"),
        ("norm=none, ffn=geglu, pos=sinusoidal",
         r"norm=none: .*; pos=sinusoidal\(base=10000.0\): a LlamaForCausalLM has pos=rope"),
    ],
)  # fmt: skip
def test_what_llama_cannot_express_is_refused_by_name(
    change: str, message: str, tmp_path: Path, capsys
) -> None:
    path = lmcore.build_model(f"{SMALL}, {change}").save(tmp_path / "m.safetensors")
    with pytest.raises(
        ConversionError,
        match=r"cannot convert this model to a Hugging Face LlamaForCausalLM without losing "
        r"something: " + message,
    ):
        convert_to_hf(path, tmp_path / "hf", model_type="llama")
    argv = ["convert", "--to-hf", str(path), str(tmp_path / "hf"), "--model-type", "llama"]
    assert main(argv) == 2
    assert "lmcore convert: error: cannot convert this model" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_a_third_party_rmsnorm_is_not_taken_for_llamas(tmp_path: Path) -> None:
    from lmcore import Component, Registry
    from lmcore_rmsnorm import RMSNorm

    registry = Registry()
    registry.add(Component(kind="norm", name="rmsnorm", build=RMSNorm), name="mine")
    with pytest.raises(
        ConversionError,
        match=r"norm=mine:rmsnorm comes from registered in-process \(plugin 'mine', module "
        r"lmcore_rmsnorm\), not lmcore's built-in: only the built-in is known to compute what "
        r"transformers computes",
    ):
        save_llama(lmcore.build_model(f"{SMALL}, norm=mine:rmsnorm", registry=registry), tmp_path)


# ------------------------------------------------------------------ damaged directories


def test_missing_unexpected_and_misshapen_tensors_are_listed(tmp_path: Path) -> None:
    random_llama(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)  # derived: skipped
    state["model.norm.weight"] = torch.ones(31)  # the probe: this one went unmentioned
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        ConversionError,
        match=r"the tensors are not those of a LlamaForCausalLM with this config: missing \(1\): "
        r"model.layers.1.mlp.up_proj.weight; unexpected \(1\): "
        r"model.layers.0.self_attn.q_proj.bias; wrong shape \(1\): model.norm.weight \(file "
        r"\(31,\), model \(32,\)\)$",
    ):
        load_llama(tmp_path)


def test_a_derived_inv_freq_buffer_is_skipped(tmp_path: Path) -> None:
    reference = random_llama(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(4)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = tokens()
    assert (lm_logits(load_llama(tmp_path), ids) - hf_logits(reference, ids)).abs().max() <= 1e-5


def test_directories_without_usable_weights(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"is not a directory"):
        load_llama(tmp_path / "nothing")
    with pytest.raises(ConversionError, match=r"has no config.json; a Hugging Face model"):
        load_llama(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_V4))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(
        ConversionError,
        match=r"has no model.safetensors and no model.safetensors.index.json \(found "
        r"pytorch_model.bin: pickle files, which lmcore never loads; re-save the model with "
        r"save_pretrained\(DIR\), which writes safetensors\)",
    ):
        load_llama(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(
        ConversionError,
        match=r"names shards that are not in the directory: model-00002-of-00002.safetensors; "
        r"copy the whole model directory",
    ):
        load_llama(tmp_path)


def test_to_hf_refuses_a_directory_that_is_not_empty_and_force_replaces_it_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: into a copy of another model's directory --to-hf exited 0, replaced
    # config.json and model.safetensors and left its generation_config.json mixed in; into a
    # directory with an unrelated config.json, the same.
    ckpt = lmcore.build_model(SMALL).save(tmp_path / "m.safetensors")
    other = tmp_path / "other"
    random_llama(other)
    (other / "generation_config.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    unrelated = tmp_path / "unrelated"
    unrelated.mkdir()
    (unrelated / "config.json").write_text('{"x": 1}')
    for target, held in ((other, "config.json, generation_config.json, model.safetensors"),
                         (unrelated, "config.json")):  # fmt: skip
        assert main(["convert", "--to-hf", str(ckpt), str(target)]) == 2
        assert capsys.readouterr().err == (
            f"lmcore convert: error: target directory {str(target)!r} is not empty (it holds "
            f"{held}); nothing was written: pass --force to replace it whole, or choose an "
            "empty directory\n"
        )
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    assert main(["convert", "--to-hf", str(ckpt), str(other), "--force"]) == 0
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "model.safetensors"]
    assert LlamaForCausalLM.from_pretrained(other).config.vocab_size == 97
    # The checkpoint itself inside the directory --force would replace: refused, kept
    inside = tmp_path / "inside"
    inside.mkdir()
    kept = lmcore.build_model(SMALL).save(inside / "m.safetensors")
    assert main(["convert", "--to-hf", str(kept), str(inside), "--force"]) == 2
    assert f"the checkpoint {str(kept)!r} is inside target directory" in capsys.readouterr().err
    assert kept.is_file()
    assert main(["convert", "--from-hf", str(other), str(tmp_path / "x.safetensors"),
                 "--force"]) == 2  # fmt: skip
    assert "--force and --model-type apply to --to-hf only" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["/abs/other.safetensors", "../../x.safetensors", "link"])
def test_shards_outside_the_directory_are_refused(tmp_path: Path, name: str) -> None:
    # The probe: an index whose weight_map names /abs/other.safetensors or ../../x.safetensors
    # was read and converted (exit 0).
    model = tmp_path / "llama"
    random_llama(model, shard=True)
    index = model / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    last = sorted(set(data["weight_map"].values()))[-1]
    outside = tmp_path / "elsewhere.safetensors"
    (model / last).rename(outside)
    target = {"/abs/other.safetensors": str(outside), "../../x.safetensors": "../elsewhere.safetensors",
              "link": "link.safetensors"}[name]  # fmt: skip
    if name == "link":
        (model / target).symlink_to(outside)
    data["weight_map"] = {k: target if v == last else v for k, v in data["weight_map"].items()}
    index.write_text(json.dumps(data))
    with pytest.raises(ConversionError, match=re.escape(
        f"{index}: names {target!r}, which resolves to {str(outside)!r}, outside the model "
        f"directory {model}; a model directory holds its own weights: copy the shards into it"
    )):  # fmt: skip
        load_llama(model)


def test_the_hub_caches_links_into_blobs_are_its_own(tmp_path: Path) -> None:
    # models--org--name/snapshots/REV/* link to ../../blobs/<hash>, as huggingface_hub lays out
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    random_llama(tmp_path / "plain")
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, p in enumerate(sorted((tmp_path / "plain").iterdir())):
        p.rename(blobs / f"blob{i}")
        (snapshot / p.name).symlink_to(f"../../blobs/blob{i}")
    assert load_llama(snapshot).spec.vocab_size == 97


def test_integer_tensors_convert_only_when_asked(tmp_path: Path) -> None:
    # The probe: int32 tensors were cast to float silently by --from-hf.
    random_llama(tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(str(weights))
    state["model.norm.weight"] = torch.ones(32, dtype=torch.int32)
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=re.escape(
        f"{tmp_path}: tensors of another dtype than the model's, which loading would convert "
        "without asking: ln_final.weight (int32, model float32); lmcore never changes a dtype "
        "silently: load with dtype= (--dtype) to convert every tensor, or fix the file"
    )):  # fmt: skip
        load_llama(tmp_path)
    converted = load_llama(tmp_path, dtype=torch.float32)
    assert torch.equal(converted.ln_final.weight, torch.ones(32))


def test_a_config_nested_too_deep_is_refused_in_one_line(tmp_path: Path) -> None:
    random_llama(tmp_path)
    (tmp_path / "config.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(
        ConversionError, match=r"config.json: nests deeper than Python's parser follows"
    ):
        load_llama(tmp_path)


def test_product_code_never_imports_transformers() -> None:
    root = Path(lmcore.__file__).parent
    for path in [*root.rglob("*.py"), *(root.parent / "plugins").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "transformers" for n in names), path


def test_the_directorys_tokenizer_goes_into_the_checkpoint_and_back(tmp_path: Path) -> None:
    """--from-hf keeps tokenizer.json, its special tokens and the chat template in the
    checkpoint; --to-hf writes them back, and transformers' own tokenizer reads them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    source = tmp_path / "hf"
    random_llama(source)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=97,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:60],
        show_progress=False,
    )
    tok.train_from_iterator(["the cat sat on the mat"] * 10, trainer)
    tok.save(str(source / "tokenizer.json"))
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    (source / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "<|im_end|>"})
    )
    out = convert_from_hf(source, tmp_path / "m.safetensors")
    saved = lmcore.load(out).tokenizer
    assert saved is not None and saved.json == tok.to_str()
    assert saved.chat_template == template and saved.eos_token_id == 2
    assert saved.stop_token_ids == (2, 0)  # end of turn, then end of text

    back = convert_to_hf(out, tmp_path / "back")
    assert sorted(p.name for p in back.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    hf_tok = transformers.AutoTokenizer.from_pretrained(back)
    text = "the mat sat on the cat"
    assert hf_tok(text)["input_ids"] == tok.encode(text).ids
    assert hf_tok.eos_token == "<|im_end|>"
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == saved.render_chat([{"role": "user", "content": "hi"}])
