"""Every GGUF architecture lmcore converts, both ways, on tiny files written here as llama.cpp's
converter writes them (tests/helpers/gguf.py `write_as_llama_cpp`: gguf's own tensor map, q/k
rows permuted for Llama, Gemma's norm gains + 1, GPT-2's Conv1D weights transposed, GPT-NeoX's
q/k/v regrouped, experts stacked in 3-D): read, they give the transformers model's logits
(and so does transformers' own GGUF loader, where it reads the architecture); written back by
lmcore, they are the same file: the same tensors, the same metadata, the same logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch


from lmcore.errors import ConversionError
from lmcore.gguf import convert_to_gguf, load_gguf, read_gguf, save_gguf
from lmcore.gguf.writing import choose
from lmcore.hf import convert_from_hf, load_hf
from tests.helpers.errors import raises_naming
from tests.helpers.gguf import (
    GGUF_CASES,
    GGUF_IDS,
    TRANSFORMERS_READS,
    arch_of,
    hf_case,
    needs_gguf,
    write_as_llama_cpp,
)
from tests.helpers.hf import quiet_transformers

gguf = needs_gguf()
transformers = quiet_transformers()

# case -> what its spec says that sets the architecture apart
SPECS = {
    "llama": "theta=5000.0",
    "mixtral": "ffn=moe(num_experts=4,top_k=2",
    "qwen2": "qkv_bias=true",
    "qwen3": "head_dim=128",
    "qwen3moe": "renormalize=true",
    "gemma": "zero_centered=true",
    "gemma2": "window[0]=4,attn_softcap=50.0",
    "gemma3": "pos[5]=rope(theta=1000000.0),attn=sdpa,qk_norm=rmsnorm(eps=1e-06,zero_centered=true),window[0:5]=4",
    "gemma3-scaled": "pos[5]=rope(theta=1000000.0,scaling=linear,factor=4.0)",
    "phi3": "rope(theta=10000.0)",
    "phi3-partial": "fraction=0.5),attn=sdpa,window=5",
    "olmo2": "qk_norm_scope=full",
    "gpt2": "pos=learned",
    "gptneox": "block=parallel(norms=2)",
    "smollm3": "pos=rope(theta=2000000.0),pos[3]=nope",
    "mamba2": "context_length=1048576,d_model=64,num_layers=2,num_heads=16,num_kv_heads=16,head_dim=8,d_ff=1,block=prenorm,tie_embeddings=false,norm=rmsnorm(eps=1e-05),ffn=none,pos=nope,mixer=mamba2(d_state=8,expand=2,ssm_head_dim=0,n_groups=2,conv_size=4,chunk_size=256,conv_bias=true,bias=false",
    "qwen3next": "shared=swiglu(d_ff=20),shared_gate=sigmoid,aux_loss_coef=0.0),pos=rope(theta=10000.0,fraction=0.25),mixer[0::2]=gated_deltanet(num_k_heads=2,num_v_heads=4,head_k_dim=8,head_v_dim=12,conv_size=4,chunk_size=64,eps=1e-06),attn=sdpa,qk_norm=rmsnorm(eps=1e-06,zero_centered=true),attn_gate=true",
    "olmo3": "block=reordered,tie_embeddings=false,norm=rmsnorm(eps=1e-05),ffn=swiglu,pos=rope(theta=5000.0),attn=sdpa,qk_norm=rmsnorm(eps=1e-05),qk_norm_scope=full,window[0:3]=4",
    "falcon-h1": "pos=rope(theta=500.0),mixer=attention_mamba2(d_state=8,expand=2,ssm_head_dim=8,n_groups=2,conv_size=4,chunk_size=256,conv_bias=true,bias=false,eps=1e-05,d_inner=48,attention_in=1.0,attention_out=1.0,ssm_in=1.0,ssm_out=1.0)",
    "lfm2": "d_ff=112,block=prenorm,tie_embeddings=true,norm=rmsnorm(eps=1e-05),ffn=swiglu,pos=rope(theta=1000000.0),mixer[0::2]=short_conv(conv_size=3,bias=false)",
}
# the architecture a model is written as when nothing names one: the first that holds it
# (a Phi-3 rotating all of each head is a Llama; one with a window is written as `phi3` only
# when asked for, llama.cpp leaving the window out: convert_to_gguf prefers its origin, below)
NATURAL = {"mixtral": "llama", "phi3": "llama", "phi3-partial": None}


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(GGUF_IDS)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("case", GGUF_CASES)
def test_a_llama_cpp_file_gives_hugging_faces_logits(tmp_path: Path, case: str) -> None:
    hf = hf_case(case)
    path = write_as_llama_cpp(tmp_path / "m.gguf", case, hf)
    model = load_gguf(path)
    assert SPECS[case] in str(model.spec)
    expected = _logits(hf)
    torch.testing.assert_close(_logits(model), expected, atol=1e-4, rtol=0)
    if case in TRANSFORMERS_READS:  # the same file, through transformers' own GGUF loader
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, gguf_file="m.gguf", dtype=torch.float32
        )
        torch.testing.assert_close(_logits(theirs), expected, atol=1e-4, rtol=0)


# keys lmcore writes that the converter leaves out (each checked against the heads) or holds
# otherwise: Qwen3-MoE's dense width, unused with every layer's FFN the experts
_EXTRA = ("vocab_size", "rope.dimension_count", "attention.key_length",
          "attention.value_length", "rope.freq_base")  # fmt: skip
_LOST = {"phi3.rope.scaling.original_context_length", "qwen3moe.feed_forward_length",
         "qwen3next.feed_forward_length"}


@pytest.mark.parametrize("case", GGUF_CASES)
def test_lmcore_writes_the_file_llama_cpp_writes(tmp_path: Path, case: str) -> None:
    hf = hf_case(case)
    reference = write_as_llama_cpp(tmp_path / "ref.gguf", case, hf)
    model = load_gguf(reference)
    natural = NATURAL.get(case, arch_of(case))
    if natural is None:
        with raises_naming(ConversionError, "llama.cpp disables Phi-3's sliding window"):
            choose(model)
    else:
        assert choose(model)[0].name == natural
    written = save_gguf(model, tmp_path / "m.gguf", architecture=arch_of(case))
    ours, theirs = gguf.GGUFReader(str(written)), gguf.GGUFReader(str(reference))
    assert ours.fields["general.architecture"].contents() == arch_of(case)
    mine = {t.name: np.asarray(t.data) for t in ours.tensors}
    held = {t.name: np.asarray(t.data) for t in theirs.tensors}
    assert mine.keys() == held.keys()
    for name, data in held.items():
        assert mine[name].shape == data.shape, name
        np.testing.assert_allclose(mine[name], data, atol=1e-6, rtol=0, err_msg=name)
    meta, ref = read_gguf(written).metadata, read_gguf(reference).metadata
    for key, value in ref.items():
        if not key.startswith(("general.", "tokenizer.")) and key not in _LOST:
            assert meta.get(key) == value, key
    extra = {k.partition(".")[2] for k in set(meta) - set(ref) if not k.startswith("general.")}
    assert extra <= set(_EXTRA), extra
    expected = _logits(hf)
    torch.testing.assert_close(_logits(load_gguf(written)), expected, atol=1e-4, rtol=0)
    # transformers sizes GPT-2's and LFM2's vocabulary and Phi-3's padding id by the tokenizer alone
    if case in TRANSFORMERS_READS and case not in ("gpt2", "phi3", "lfm2"):
        again = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, gguf_file="m.gguf", dtype=torch.float32
        )
        torch.testing.assert_close(_logits(again), expected, atol=1e-4, rtol=0)


def test_convert_to_gguf_writes_the_architecture_the_model_came_from(tmp_path: Path) -> None:
    hf = hf_case("phi3")
    hf.save_pretrained(tmp_path / "hf")
    ckpt = convert_from_hf(tmp_path / "hf", tmp_path / "m.safetensors")
    out = convert_to_gguf(ckpt, tmp_path / "m.gguf")
    assert read_gguf(out).architecture == "phi3"  # not llama, which holds it too
    assert "blk.0.attn_qkv.weight" in read_gguf(out).tensors
    out = convert_to_gguf(ckpt, tmp_path / "l.gguf", architecture="llama")
    assert "blk.0.attn_q.weight" in read_gguf(out).tensors
    torch.testing.assert_close(_logits(load_gguf(out)), _logits(hf), atol=1e-4, rtol=0)


def _hf_model(model_type: str, **config: Any) -> Any:
    sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
    if model_type == "gpt2":
        sizes = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)
    if model_type == "mamba2":
        sizes = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2)
    c = transformers.AutoConfig.for_model(model_type, **{**sizes, **config})
    return transformers.AutoModelForCausalLM.from_config(c)


_FALCON_H1 = dict(head_dim=8, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8, mamba_n_groups=2,
                  mamba_d_state=8, mamba_rms_norm=True, mamba_norm_before_gate=False)
# what no GGUF architecture holds, refused by name before a byte is written
UNWRITABLE = {
    # llama.cpp's llama has no window, and its phi3 ignores the one the file holds
    "mistral-window": (("mistral", {"sliding_window": 8}),
                       ("as llama: window=8: a LlamaForCausalLM has window=0",
                        "as phi3: sliding_window=8: llama.cpp disables Phi-3's sliding window",
                        "pass architecture='phi3' to write it anyway")),
    "gpt2-inverse-scale": (("gpt2", {"scale_attn_by_inverse_layer_idx": True}),
                           ("query_scale", "GGUF gpt2")),
    "gemma3-pattern": (("gemma3_text", {"head_dim": 8, "query_pre_attn_scalar": 8,
                                        "num_hidden_layers": 4, "sliding_window_pattern": 2}),
                       ("as gemma3 (gemma3_text)",
                        "window=0, window[0::2]=4096: a GGUF gemma3 has window=4096")),
    "gemma2-no-softcap": (("gemma2", {"attn_logit_softcapping": None, "head_dim": 8,
                                      "query_pre_attn_scalar": 8}),
                          ("attn_softcap=0.0", "GGUF gemma2 has attn_softcap=50.0")),
    "gemma-untied": (("gemma", {"tie_word_embeddings": False, "head_dim": 8}),
                     ("tie_embeddings=false", "a GGUF gemma has tie_embeddings=true")),
    "qwen3moe-dense": (("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2,
                                      "moe_intermediate_size": 16, "mlp_only_layers": [1],
                                      "norm_topk_prob": True}),
                       ("as qwen3moe (qwen3_moe)", "d_ff[1]=48: a GGUF qwen3moe has d_ff=16")),
    "qwen3moe-unnormalised": (("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2,
                                             "moe_intermediate_size": 16,
                                             "norm_topk_prob": False}),
                              ("as qwen3moe (qwen3_moe)", "renormalize=false", "GGUF qwen3moe")),
    # llama.cpp's smollm3 rotates nothing on every fourth layer, and slides on none
    "smollm3-nope-step": (("smollm3", {"num_hidden_layers": 4, "no_rope_layer_interval": 2,
                                       "pad_token_id": 0}),
                          ("as smollm3", "pos[1::2]=nope: a GGUF smollm3 has", "pos[3]=nope")),
    # llama.cpp's lfm2 has no convolution biases
    "lfm2-conv-bias": (("lfm2", {"layer_types": ["conv", "full_attention"], "conv_bias": True}),
                       ("as lfm2", "short_conv(conv_size=3,bias=true): a GGUF lfm2 has",
                        "short_conv(conv_size=3,bias=false)")),
    # llama.cpp rotates OLMo 3's sliding layers with the full layers' base
    "olmo3-bases": (("olmo3", {"num_hidden_layers": 4, "sliding_window": 8, "pad_token_id": 0,
                               "rope_parameters": {
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                   "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
                    ("as olmo2 (olmo3)", "pos[0:3]=rope(theta=500.0)", "a GGUF olmo2 has")),
    # llama.cpp's qwen3next has experts on every layer
    "qwen3next-dense": (("qwen3_next", {"full_attention_interval": 2, "head_dim": 16,
                                        "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                        "linear_key_head_dim": 8, "linear_value_head_dim": 12,
                                        "num_experts": 4, "num_experts_per_tok": 2,
                                        "moe_intermediate_size": 24, "mlp_only_layers": [1],
                                        "shared_expert_intermediate_size": 20}),
                        ("as qwen3next (qwen3_next)", "d_ff[1]=48", "a GGUF qwen3next has")),
    # llama.cpp's mamba2 has no projection biases
    "mamba2-bias": (("mamba2", {"num_heads": 8, "head_dim": 8, "state_size": 8, "n_groups": 2,
                                "use_bias": True}),
                    ("as mamba2", "bias=true", "a GGUF mamba2 has")),
    "smollm3-window": (("smollm3", {"num_hidden_layers": 4, "use_sliding_window": True, "pad_token_id": 0,
                                    "sliding_window": 8}),
                       ("as smollm3", "window[3]=8", "a GGUF smollm3 has")),
}  # fmt: skip


@pytest.mark.parametrize(("source", "facts"), UNWRITABLE.values(), ids=UNWRITABLE.keys())
def test_what_no_gguf_architecture_holds_is_refused_by_name(
    tmp_path: Path, source: tuple[str, dict[str, Any]], facts: tuple[str, ...]
) -> None:
    model_type, config = source
    _hf_model(model_type, **config).save_pretrained(tmp_path / "hf")
    model = load_hf(tmp_path / "hf")
    with raises_naming(ConversionError, "cannot write this model as GGUF", *facts):
        save_gguf(model, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    with raises_naming(ConversionError, "GGUF architecture 'bert'", "gemma2, gemma3", "gpt2"):
        save_gguf(model, tmp_path / "m.gguf", architecture="bert")


def _two_experts_too_few(x: Any) -> Any:
    return x[:2]


# a file broken one way at a time -> the facts its one-line refusal names
HOSTILE = {
    "expert-count": ("qwen3moe", {}, (), {"blk.1.ffn_gate_exps.weight": _two_experts_too_few},
                     ("tensor blk.1.ffn_gate_exps.weight has shape (2, 768, 64)",
                      "(4, 768, 64)", "4: qwen3moe.expert_count",
                      "768: qwen3moe.expert_feed_forward_length")),
    "gemma2-norm": ("gemma2", {}, (), {"blk.0.post_ffw_norm.weight": lambda x: x[:60]},
                    ("tensor blk.0.post_ffw_norm.weight has shape (60,)",
                     "64: gemma2.embedding_length")),
    "phi3-fused-up": ("phi3", {}, (), {"blk.0.ffn_up.weight": lambda x: x[:96]},
                      ("blk.0.ffn_up.weight has shape (96, 64)", "(192, 64)",
                       "2 x phi3.feed_forward_length (gate and up)")),
    "phi3-missing": ("phi3", {}, ("blk.1.attn_qkv.weight",), {},
                     ("missing (1): model.layers.1.self_attn.qkv_proj.weight",)),
    "gemma-output": ("gemma", {}, (), {}, ()),  # filled in below: an output.weight
    "type": ("gemma2", {"attention.sliding_window": "4"}, (), {},
             ("gemma2.attention.sliding_window",)),
    "type-count": ("gptneox", {"block_count": 2.5}, (), {}, ("gptneox.block_count",)),
    "type-derived": ("phi3-partial", {"rope.dimension_count": "8"}, (), {},
                     ("phi3.rope.dimension_count",)),
    "type-window": ("phi3-partial", {"attention.sliding_window": 2.5}, (), {},
                    ("phi3.attention.sliding_window",)),
    "longrope": ("phi3", {}, (), {}, ()),  # filled in below: rope_factors_long
    "smollm3-shape": ("smollm3", {}, (), {"blk.3.attn_k.weight": lambda x: x[:16]},
                      ("tensor blk.3.attn_k.weight has shape (16, 64)", "(32, 64)",
                       "smollm3.attention.head_count_kv 2")),
    "smollm3-missing": ("smollm3", {}, ("blk.3.ffn_up.weight",), {},
                        ("missing (1): model.layers.3.mlp.up_proj.weight",)),
    "smollm3-type": ("smollm3", {"attention.head_count_kv": "2"}, (), {},
                     ("smollm3.attention.head_count_kv",)),
    "olmo3-yarn": ("olmo3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0}, (), {},
                   ("olmo2.rope.scaling.type='yarn'", "lmcore converts 'none' only")),
    "olmo3-type": ("olmo3", {"attention.sliding_window_pattern": "TTTF"}, (), {},
                   ("olmo2.attention.sliding_window_pattern",)),
    "olmo3-shape": ("olmo3", {}, (), {"blk.2.attn_k_norm.weight": lambda x: x[:16]},
                    ("tensor blk.2.attn_k_norm.weight has shape (16,)", "(32,)")),
    "qwen3next-shape": ("qwen3next", {}, (), {"blk.1.attn_k.weight": lambda x: x[:32]},
                        ("tensor blk.1.attn_k.weight has shape (32, 64)", "(64, 64)",
                         "qwen3next.attention.head_count_kv 2 x head width 32")),
    "qwen3next-missing": ("qwen3next", {}, ("blk.2.ssm_conv1d.weight",), {},
                          ("missing (1): model.layers.2.linear_attn.conv1d.weight",)),
    "qwen3next-type": ("qwen3next", {"ssm.inner_size": "48"}, (), {}, ("qwen3next.ssm.inner_size",)),
    "mamba2-norm": ("mamba2", {}, (), {"blk.1.attn_norm.weight": lambda x: x[:60]},
                    ("tensor blk.1.attn_norm.weight has shape (60,)", "64: mamba2.embedding_length")),
    "mamba2-missing": ("mamba2", {}, ("blk.0.ssm_d",), {}, ("missing (1): backbone.layers.0.mixer.D",)),
    "mamba2-type": ("mamba2", {"ssm.state_size": "8"}, (), {}, ("mamba2.ssm.state_size",)),
    "mamba2-heads": ("mamba2", {"attention.head_count": 4}, (), {},
                     ("mamba2.attention.head_count=4", "lmcore converts 0 only")),
    "falcon-h1-shape": ("falcon-h1", {}, (), {"blk.1.attn_k.weight": lambda x: x[:16]},
                        ("tensor blk.1.attn_k.weight has shape (16, 64)", "(32, 64)",
                         "falcon-h1.attention.head_count_kv 2 x head width 16")),
    "falcon-h1-missing": ("falcon-h1", {}, ("blk.0.ssm_norm.weight",), {},
                          ("missing (1): model.layers.0.mamba.norm.weight",)),
    "falcon-h1-norm": ("falcon-h1", {}, (), {"blk.1.ffn_norm": lambda x: x[:60]},
                       ("tensor blk.1.ffn_norm has shape (60,)", "64: falcon-h1.embedding_length")),
    "falcon-h1-type": ("falcon-h1", {"ssm.inner_size": "48"}, (), {}, ("falcon-h1.ssm.inner_size",)),
    "falcon-h1-type-heads": ("falcon-h1", {"ssm.time_step_rank": "6"}, (), {},
                             ("falcon-h1.ssm.time_step_rank",)),
    "lfm2-shape": ("lfm2", {}, (), {"blk.1.attn_k.weight": lambda x: x[:16]},
                   ("tensor blk.1.attn_k.weight has shape (16, 64)", "(32, 64)",
                    "lfm2.attention.head_count_kv 2")),
    "lfm2-missing": ("lfm2", {}, ("blk.2.shortconv.conv.weight",), {},
                     ("missing (1): model.layers.2.conv.conv.weight",)),
    "lfm2-type": ("lfm2", {"attention.head_count_kv": "2"}, (), {},
                  ("lfm2.attention.head_count_kv",)),
    "lfm2-type-cache": ("lfm2", {"shortconv.l_cache": 2.5}, (), {}, ("lfm2.shortconv.l_cache",)),
}  # fmt: skip


@pytest.mark.parametrize("broken", HOSTILE, ids=HOSTILE.keys())
def test_a_broken_file_is_refused_in_one_line_naming_what(tmp_path: Path, broken: str) -> None:
    case, meta, drop, tensors, facts = HOSTILE[broken]
    path = write_as_llama_cpp(tmp_path / "m.gguf", case, hf_case(case), meta, drop=drop,
                              tensors=tensors)  # fmt: skip
    if broken in ("gemma-output", "longrope"):  # one tensor more than the file should hold
        file, fields = read_gguf(path), gguf.GGUFReader(str(path)).fields
        w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), file.architecture)
        for key, value in file.metadata.items():
            if key != "general.architecture" and not key.startswith("GGUF"):
                field = fields[key]
                w.add_key_value(key, value, field.types[0], field.types[-1] if len(
                    field.types) > 1 else None)  # fmt: skip
        for name, t in file.tensors_float().items():
            w.add_tensor(name, t.numpy())
        extra = "output.weight" if broken == "gemma-output" else "rope_factors_long.weight"
        w.add_tensor(extra, np.ones((128, 64) if broken == "gemma-output" else (8,), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        path = tmp_path / "x.gguf"
        facts = (("unexpected (1): output.weight",) if broken == "gemma-output"
                 else ("tensor rope_factors_long.weight", "LongRoPE"))  # fmt: skip
    with raises_naming(ConversionError, str(path), *facts) as caught:
        load_gguf(path)
    assert "\n" not in str(caught.value)


def test_an_unknown_architecture_is_refused_naming_those_that_convert(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "bert")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with raises_naming(ConversionError, "general.architecture is 'bert'", "gemma, gemma2, gemma3",
                       "lfm2, llama, mamba2, olmo2, phi3, qwen2, qwen3, qwen3moe", "smollm3"):  # fmt: skip
        load_gguf(tmp_path / "m.gguf")


def test_a_falcon_h1_with_multipliers_is_written_folded_as_the_converter_folds_them(
    tmp_path: Path,
) -> None:
    hf = hf_case("falcon-h1")
    reference = write_as_llama_cpp(tmp_path / "ref.gguf", "falcon-h1", hf)
    hf.save_pretrained(tmp_path / "hf")
    model = load_hf(tmp_path / "hf")  # its multipliers spec arguments, none folded
    assert "embed_scale=1.5" in str(model.spec)
    written = save_gguf(model, tmp_path / "m.gguf")
    assert read_gguf(written).architecture == "falcon-h1"
    ours, theirs = gguf.GGUFReader(str(written)), gguf.GGUFReader(str(reference))
    mine = {t.name: np.asarray(t.data) for t in ours.tensors}
    held = {t.name: np.asarray(t.data) for t in theirs.tensors}
    assert mine.keys() == held.keys()
    for name, data in held.items():  # the same fold, up to float32 rounding
        np.testing.assert_allclose(mine[name], data, atol=1e-6, rtol=1e-6, err_msg=name)
    torch.testing.assert_close(_logits(load_gguf(written)), _logits(hf), atol=1e-4, rtol=0)


# what no falcon-h1 file holds: llama.cpp's graph has no attention biases, nor a norm before the
# gate; a tied model's lm_head multiplier over its embedding one folds into no weight
FALCON_H1_UNWRITABLE = {
    "bias": ({"attention_bias": True}, ("qkv_bias=true", "a GGUF falcon-h1 has")),
    "norm-first": ({"mamba_norm_before_gate": True},
                   ("gate_norm=norm_first", "a GGUF falcon-h1 has")),
    "tied": ({"tie_word_embeddings": True, "embedding_multiplier": 2.0, "lm_head_multiplier": 0.5},
             ("logit_scale=0.25", "a GGUF falcon-h1 has")),
}  # fmt: skip


@pytest.mark.parametrize("broken", FALCON_H1_UNWRITABLE, ids=FALCON_H1_UNWRITABLE.keys())
def test_what_a_falcon_h1_file_cannot_fold_is_refused_by_name(tmp_path: Path, broken: str) -> None:
    config, facts = FALCON_H1_UNWRITABLE[broken]
    _hf_model("falcon_h1", **{**_FALCON_H1, **config}).save_pretrained(tmp_path / "hf")
    model = load_hf(tmp_path / "hf")
    with raises_naming(ConversionError, "as falcon-h1 (falcon_h1)", *facts) as caught:
        save_gguf(model, tmp_path / "m.gguf", architecture="falcon-h1")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "m.gguf").exists()


def test_a_tied_falcon_h1_whose_multipliers_agree_folds_into_the_embedding(tmp_path: Path) -> None:
    hf = _hf_model("falcon_h1", **_FALCON_H1, tie_word_embeddings=True, embedding_multiplier=1.5,
                   lm_head_multiplier=1.5, key_multiplier=0.7, ssm_multipliers=[0.5, 1.5, 0.8,
                   1.25, 0.7], mlp_multipliers=[0.9, 0.6], vocab_size=128)  # fmt: skip
    hf.save_pretrained(tmp_path / "hf")
    written = save_gguf(load_hf(tmp_path / "hf"), tmp_path / "m.gguf")
    assert "output.weight" not in read_gguf(written).tensors
    torch.testing.assert_close(_logits(load_gguf(written)), _logits(hf.eval()), atol=1e-4, rtol=0)
