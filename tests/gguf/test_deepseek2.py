"""GGUF deepseek2 (DeepSeek-V3 as llama.cpp stores it) both ways, on tiny files written here as
llama.cpp's converter (DeepseekV2Model) writes them, by code independent of lmcore's: the newer
split of kv_b_proj into attn_k_b and attn_v_b, and the older attn_kv_b; read, they give the
transformers model's logits; written back by lmcore, the newer form is the same file."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lmcore.errors import ConversionError
from lmcore.gguf import load_gguf, read_gguf, save_gguf
from lmcore.gguf.writing import choose
from lmcore.hf import load_hf
from tests.helpers.errors import raises_naming
from tests.helpers.gguf import GGUF_IDS, needs_gguf, perturb_norms
from tests.helpers.hf import quiet_transformers

gguf = needs_gguf()
transformers = quiet_transformers()

_SIZES: dict[str, Any] = dict(
    vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2,
    num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16,
    routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=10, qk_nope_head_dim=6,
    qk_rope_head_dim=4, v_head_dim=8, rms_norm_eps=1e-6,
)  # fmt: skip
# case -> (config, the older attn_kv_b form): YaRN with mscale = mscale_all_dim (what GGUF holds)
CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "split": (dict(_SIZES, q_lora_rank=12, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 0.8, "mscale_all_dim": 0.8,
        "original_max_position_embeddings": 16}), False),
    "older": (dict(_SIZES, q_lora_rank=None, rope_parameters={"rope_type": "default",
                                                              "rope_theta": 500.0}), True),
}  # fmt: skip


def hf_deepseek(config: dict[str, Any]) -> Any:
    c = transformers.AutoConfig.for_model("deepseek_v3", **config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(c, attn_implementation="eager")
    with torch.no_grad():  # a correction bias that changes which experts are chosen
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
    return perturb_norms(model.eval())


def _metadata(c: Any, older: bool) -> dict[str, Any]:
    """TextModel.set_gguf_parameters, then DeepseekV2Model's (scoring_func "sigmoid", as
    DeepSeek-V3's config.json says, gives expert_gating_func 2)."""
    rope = c.rope_parameters
    meta: dict[str, Any] = {
        "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
        "block_count": c.num_hidden_layers, "feed_forward_length": c.intermediate_size,
        "attention.head_count": c.num_attention_heads,
        "attention.head_count_kv": c.num_attention_heads if older else 1,
        "rope.freq_base": rope["rope_theta"], "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
        "expert_count": c.n_routed_experts, "expert_used_count": c.num_experts_per_tok,
        "expert_group_count": c.n_group, "expert_group_used_count": c.topk_group,
        "expert_gating_func": 2,
    }  # fmt: skip
    if rope["rope_type"] == "yarn":
        meta |= {"rope.scaling.type": "yarn", "rope.scaling.factor": rope["factor"],
                 "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
                 "rope.scaling.yarn_beta_fast": rope["beta_fast"],
                 "rope.scaling.yarn_beta_slow": rope["beta_slow"]}  # fmt: skip
    meta |= {"leading_dense_block_count": c.first_k_dense_replace, "vocab_size": c.vocab_size}
    if c.q_lora_rank is not None:
        meta["attention.q_lora_rank"] = c.q_lora_rank
    meta["attention.kv_lora_rank"] = c.kv_lora_rank
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    if older:  # before the MLA split: the heads as Hugging Face's
        meta |= {"attention.key_length": qk, "attention.value_length": c.v_head_dim}
    else:
        meta |= {"attention.key_length": c.kv_lora_rank + c.qk_rope_head_dim,
                 "attention.value_length": c.kv_lora_rank, "attention.key_length_mla": qk,
                 "attention.value_length_mla": c.v_head_dim}  # fmt: skip
    meta |= {"expert_feed_forward_length": c.moe_intermediate_size,
             "expert_shared_count": c.n_shared_experts,
             "expert_weights_scale": c.routed_scaling_factor,
             "expert_weights_norm": c.norm_topk_prob,
             "rope.dimension_count": c.qk_rope_head_dim}  # fmt: skip
    if rope.get("mscale_all_dim"):
        meta["rope.scaling.yarn_log_multiplier"] = 0.1 * rope["mscale_all_dim"]
    return meta


def _tensors(model: Any, older: bool) -> dict[str, np.ndarray]:
    """DeepseekV2Model.modify_tensors: experts stacked, kv_b_proj split (newer), k_b transposed."""
    c = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, c.num_hidden_layers)
    out: dict[str, Any] = {}
    for name, p in model.state_dict().items():
        x = p.detach().float()
        at = name.split(".mlp.")[0].split(".self_attn.")[0].replace("model.layers.", "blk.")
        if name.endswith("mlp.experts.gate_up_proj"):  # transformers' (E, 2·ff, d): gate, up
            out[f"{at}.ffn_gate_exps.weight"], out[f"{at}.ffn_up_exps.weight"] = x.chunk(2, 1)
        elif name.endswith("mlp.experts.down_proj"):
            out[f"{at}.ffn_down_exps.weight"] = x
        elif name.endswith("e_score_correction_bias"):
            out[f"{at}.exp_probs_b.bias"] = x
        elif name.endswith("kv_b_proj.weight") and not older:
            heads, v, nope = c.num_attention_heads, c.v_head_dim, c.qk_nope_head_dim
            k_b, v_b = x.view(heads, nope + v, x.shape[-1]).split([nope, v], dim=1)
            out[f"{at}.attn_k_b.weight"], out[f"{at}.attn_v_b.weight"] = k_b.transpose(1, 2), v_b
        else:
            target = names.get_name(name, try_suffixes=(".weight", ".bias"))
            assert target is not None, name
            out[target] = x
    return {k: np.ascontiguousarray(v.numpy(), dtype=np.float32) for k, v in out.items()}


def write_deepseek2(path: Path, model: Any, older: bool = False,
                    meta: dict[str, Any] | None = None, *, drop: tuple[str, ...] = (),
                    tensors: dict[str, Callable[[Any], Any]] | None = None) -> Path:  # fmt: skip
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name("tiny")
    T = gguf.GGUFValueType
    for key, value in {**_metadata(model.config, older), **(meta or {})}.items():
        if key in drop:
            continue
        kind = (T.BOOL if isinstance(value, bool) else T.FLOAT32 if isinstance(value, float)
                else T.STRING if isinstance(value, str) else T.UINT32)  # fmt: skip
        w.add_key_value(f"deepseek2.{key}", value, kind)
    for name, x in _tensors(model, older).items():
        if name in drop:
            continue
        if tensors and name in tensors:
            x = np.ascontiguousarray(tensors[name](x), dtype=np.float32)
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        out = model(GGUF_IDS)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("case", CASES)
def test_a_llama_cpp_deepseek2_gives_hugging_faces_logits(tmp_path: Path, case: str) -> None:
    config, older = CASES[case]
    hf = hf_deepseek(config)
    model = load_gguf(write_deepseek2(tmp_path / "m.gguf", hf, older))
    spec = str(model.spec)
    for fact in (
        "ffn[1:]=moe(num_experts=8,top_k=2",
        "renormalize=true,shared=swiglu(d_ff=16)",
        "score=sigmoid,n_group=4,topk_group=2,score_bias=true,scale=2.5",
        "mixer=mla(kv_lora_rank=10",
        "rope_interleave=true",
    ):
        assert fact in spec
    assert ("scaling=yarn" in spec) == (case == "split")
    torch.testing.assert_close(_logits(model), _logits(hf), atol=1e-4, rtol=0)


def test_a_yarn_without_log_multiplier_reads_as_llama_cpp_runs_it(tmp_path: Path) -> None:
    """No rope.scaling.yarn_log_multiplier: llama.cpp scales the rotated dimensions by its
    default g = 1 + 0.1 ln(factor) and q·k by g², as transformers with mscale_all_dim 1 and
    attention_factor g does."""
    config = CASES["split"][0]
    rope = {k: v for k, v in config["rope_parameters"].items() if k != "mscale"}
    rope |= {"mscale_all_dim": 1.0, "attention_factor": 1.0 + 0.1 * math.log(4.0)}
    hf = hf_deepseek({**config, "rope_parameters": rope})
    path = write_deepseek2(tmp_path / "m.gguf", hf, drop=("rope.scaling.yarn_log_multiplier",))
    torch.testing.assert_close(_logits(load_gguf(path)), _logits(hf), atol=1e-4, rtol=0)


def test_lmcore_writes_the_deepseek2_file_llama_cpp_writes(tmp_path: Path) -> None:
    hf = hf_deepseek(CASES["split"][0])
    reference = write_deepseek2(tmp_path / "ref.gguf", hf)
    model = load_gguf(reference)
    assert choose(model)[0].name == "deepseek2"
    written = save_gguf(model, tmp_path / "m.gguf")
    ours, theirs = gguf.GGUFReader(str(written)), gguf.GGUFReader(str(reference))
    mine = {t.name: np.asarray(t.data) for t in ours.tensors}
    held = {t.name: np.asarray(t.data) for t in theirs.tensors}
    assert mine.keys() == held.keys()
    for name, data in held.items():
        assert mine[name].shape == data.shape, name
        np.testing.assert_allclose(mine[name], data, atol=1e-6, rtol=0, err_msg=name)
    meta, ref = read_gguf(written).metadata, read_gguf(reference).metadata
    assert {k: v for k, v in meta.items() if not k.startswith("general.")} == {
        k: v for k, v in ref.items() if not k.startswith("general.")}  # fmt: skip
    torch.testing.assert_close(_logits(load_gguf(written)), _logits(hf), atol=1e-4, rtol=0)
    # the older form reads as the same model, and is written in the newer
    older = load_gguf(write_deepseek2(tmp_path / "old.gguf", hf, older=True))
    assert older.spec == model.spec
    assert "blk.0.attn_k_b.weight" in read_gguf(save_gguf(older, tmp_path / "o.gguf")).tensors


def test_a_deepseek2_llama_cpp_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    """mscale other than mscale_all_dim (llama.cpp scales by the one), an unrotated latent."""
    base = CASES["split"][0]
    for changes, facts in (
        ({"rope_parameters": {**base["rope_parameters"], "mscale": 1.0}}, ("mscale=1.0",)),
        ({"rope_interleave": False}, ("rope_interleave=false",)),
    ):
        hf_deepseek({**base, **changes}).save_pretrained(tmp_path / "hf")
        model = load_hf(tmp_path / "hf")
        with raises_naming(ConversionError, "cannot write this model as GGUF",
                           "as deepseek2 (deepseek_v3)", *facts):  # fmt: skip
            save_gguf(model, tmp_path / "m.gguf")
        assert not (tmp_path / "m.gguf").exists()


HOSTILE = {
    "softmax": ({}, ("expert_gating_func",), {}, ("deepseek2.expert_gating_func", "softmax")),
    "expert-shape": ({}, (), {"blk.2.ffn_up_exps.weight": lambda x: x[:4]},
                     ("tensor blk.2.ffn_up_exps.weight has shape (4, 16, 32)", "(8, 16, 32)",
                      "8: deepseek2.expert_count")),
    "k_b-shape": ({}, (), {"blk.1.attn_k_b.weight": lambda x: x[:, :, :5]},
                  ("unexpected (2): blk.1.attn_k_b.weight, blk.1.attn_v_b.weight",)),
    "missing-v_b": ({}, ("blk.0.attn_v_b.weight",), {}, ("blk.0.attn_k_b.weight",)),
    "missing-bias": ({}, ("blk.1.exp_probs_b.bias",), {},
                     ("missing (1): model.layers.1.mlp.gate.e_score_correction_bias",)),
    "key-length": ({"attention.key_length": 99}, (), {}, ("deepseek2.attention.key_length",)),
    "eps": ({"attention.layer_norm_rms_epsilon": 1e-5}, (), {},
            ("deepseek2.attention.layer_norm_rms_epsilon", "latent norms")),
    "type-rank": ({"attention.kv_lora_rank": "10"}, (), {}, ("deepseek2.attention.kv_lora_rank",)),
    "type-log-mul": ({"rope.scaling.yarn_log_multiplier": "0.08"}, (), {},
                     ("deepseek2.rope.scaling.yarn_log_multiplier",)),
}  # fmt: skip


@pytest.mark.parametrize("broken", HOSTILE, ids=HOSTILE.keys())
def test_a_broken_deepseek2_file_is_refused_in_one_line(tmp_path: Path, broken: str) -> None:
    meta, drop, tensors, facts = HOSTILE[broken]
    hf = hf_deepseek(CASES["split"][0])
    path = write_deepseek2(tmp_path / "m.gguf", hf, False, meta, drop=drop, tensors=tensors)
    with raises_naming(ConversionError, str(path), *facts) as caught:
        load_gguf(path)
    assert "\n" not in str(caught.value)
