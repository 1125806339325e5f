"""GGUF gpt-oss both ways, on a tiny file written here as llama.cpp's converter (GptOssModel)
writes one, by code independent of lmcore's: read, it gives the transformers model's logits;
written back by lmcore, it is the same file (tensors, metadata, logits)."""

from __future__ import annotations

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

# sliding layer 0 of 2, YaRN over 4 x 16 positions (truncated, as llama.cpp runs it)
CONFIG: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
    num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
    rope_parameters={"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                     "original_max_position_embeddings": 16, "beta_fast": 32.0,
                     "beta_slow": 1.0, "truncate": True},
)  # fmt: skip


def hf_gpt_oss(**changes: Any) -> Any:
    config = transformers.AutoConfig.for_model("gpt_oss", **{**CONFIG, **changes})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():  # experts large enough for the clamp at 7 to bite
        for name, p in model.named_parameters():
            if "experts" in name and not name.endswith("bias"):
                p.mul_(40.0)
    return perturb_norms(model.eval())


def _metadata(c: Any) -> dict[str, Any]:
    """TextModel.set_gguf_parameters, then GptOssModel's own (window, experts' width)."""
    rope = c.rope_parameters
    return {
        "context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
        "block_count": c.num_hidden_layers, "feed_forward_length": c.intermediate_size,
        "attention.head_count": c.num_attention_heads,
        "attention.head_count_kv": c.num_key_value_heads, "rope.freq_base": rope["rope_theta"],
        "attention.layer_norm_rms_epsilon": c.rms_norm_eps,
        "expert_count": c.num_local_experts, "expert_used_count": c.num_experts_per_tok,
        "attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
        "rope.scaling.type": "yarn", "rope.scaling.factor": rope["factor"],
        "rope.scaling.original_context_length": rope["original_max_position_embeddings"],
        "rope.scaling.yarn_beta_fast": rope["beta_fast"],
        "rope.scaling.yarn_beta_slow": rope["beta_slow"],
        "attention.sliding_window": c.sliding_window,
        "expert_feed_forward_length": c.intermediate_size,
    }  # fmt: skip


def _tensors(model: Any) -> dict[str, np.ndarray]:
    """GptOssModel.modify_tensors: sinks + ".weight", experts transposed and de-interleaved."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, model.config.num_hidden_layers)
    out: dict[str, Any] = {}
    for name, p in model.state_dict().items():
        x = p.detach().float()
        if ".mlp.experts." in name:
            at = name.split(".mlp.")[0].replace("model.layers.", "blk.")
            if name.endswith("gate_up_proj"):
                x = x.transpose(-1, -2)
                out[f"{at}.ffn_gate_exps.weight"], out[f"{at}.ffn_up_exps.weight"] = (
                    x[:, ::2, :], x[:, 1::2, :])  # fmt: skip
            elif name.endswith("gate_up_proj_bias"):
                out[f"{at}.ffn_gate_exps.bias"], out[f"{at}.ffn_up_exps.bias"] = (
                    x[..., ::2], x[..., 1::2])  # fmt: skip
            elif name.endswith("down_proj"):
                out[f"{at}.ffn_down_exps.weight"] = x.transpose(-1, -2)
            else:
                out[f"{at}.ffn_down_exps.bias"] = x
            continue
        if "sinks" in name:
            name += ".weight"
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        out[target] = x
    return {k: np.ascontiguousarray(v.numpy(), dtype=np.float32) for k, v in out.items()}


def write_gpt_oss(path: Path, model: Any, meta: dict[str, Any] | None = None, *,
                  drop: tuple[str, ...] = (),
                  tensors: dict[str, Callable[[Any], Any]] | None = None,
                  experts: Any = None) -> Path:  # fmt: skip
    """`model` as llama.cpp's converter writes it; `meta` replaces or adds keys (written in the
    type of the value given), `drop` leaves keys or tensors out, `tensors` changes some,
    `experts`: the GGML type of the experts' matrices (F32 unless given)."""
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    w.add_name("tiny")
    T = gguf.GGUFValueType
    for key, value in {**_metadata(model.config), **(meta or {})}.items():
        if key in drop:
            continue
        kind = (T.BOOL if isinstance(value, bool) else T.FLOAT32 if isinstance(value, float)
                else T.STRING if isinstance(value, str) else T.UINT32)  # fmt: skip
        w.add_key_value(f"gpt-oss.{key}", value, kind)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(model.config.vocab_size)])
    for name, x in _tensors(model).items():
        if name in drop:
            continue
        if tensors and name in tensors:
            x = np.ascontiguousarray(tensors[name](x), dtype=np.float32)
        if experts is not None and name.endswith("_exps.weight"):  # llama.cpp's MXFP4 experts
            w.add_tensor(name, gguf.quants.quantize(x, experts), raw_dtype=experts)
            continue
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


def test_a_llama_cpp_gpt_oss_gives_hugging_faces_logits(tmp_path: Path) -> None:
    hf = hf_gpt_oss()
    model = load_gguf(write_gpt_oss(tmp_path / "m.gguf", hf))
    spec = str(model.spec)
    for fact in ("expert=clamped_swiglu(alpha=1.702,limit=7.0,bias=true)", "router_bias=true",
                 "scaling=yarn,factor=4.0,original_context_length=16", "window[0]=4",
                 "attn_sinks=true", "qkv_bias=true,out_bias=true"):  # fmt: skip
        assert fact in spec
    expected = _logits(hf)
    torch.testing.assert_close(_logits(model), expected, atol=1e-4, rtol=0)


def test_lmcore_writes_the_gpt_oss_file_llama_cpp_writes(tmp_path: Path) -> None:
    hf = hf_gpt_oss()
    reference = write_gpt_oss(tmp_path / "ref.gguf", hf)
    model = load_gguf(reference)
    assert choose(model)[0].name == "gpt-oss"
    written = save_gguf(model, tmp_path / "m.gguf")
    ours, theirs = gguf.GGUFReader(str(written)), gguf.GGUFReader(str(reference))
    mine = {t.name: np.asarray(t.data) for t in ours.tensors}
    held = {t.name: np.asarray(t.data) for t in theirs.tensors}
    assert mine.keys() == held.keys()
    for name, data in held.items():
        assert mine[name].shape == data.shape, name
        np.testing.assert_allclose(mine[name], data, atol=1e-6, rtol=0, err_msg=name)
    meta, ref = read_gguf(written).metadata, read_gguf(reference).metadata
    for key, value in ref.items():
        if not key.startswith(("general.", "tokenizer.")):
            assert meta.get(key) == value, key
    extra = {k for k in set(meta) - set(ref) if not k.startswith("general.")}
    assert extra <= {"gpt-oss.vocab_size", "gpt-oss.rope.dimension_count"}, extra
    torch.testing.assert_close(_logits(load_gguf(written)), _logits(hf), atol=1e-4, rtol=0)


def test_mxfp4_experts_read_as_the_values_they_hold(tmp_path: Path) -> None:
    """gpt-oss's files keep the experts in MXFP4 (the checkpoint's own blocks): dequantized by
    the gguf package, they give the logits of the transformers model holding those values."""
    hf = hf_gpt_oss()
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    model = load_gguf(write_gpt_oss(tmp_path / "m.gguf", hf, experts=mxfp4))
    exact = _tensors(hf)
    held = {k: gguf.quants.dequantize(gguf.quants.quantize(v, mxfp4), mxfp4)
            for k, v in exact.items() if k.endswith("_exps.weight")}  # fmt: skip
    state = hf.state_dict()
    for i in range(hf.config.num_hidden_layers):
        gate, up, down = (torch.from_numpy(held[f"blk.{i}.ffn_{m}_exps.weight"].copy())
                          for m in ("gate", "up", "down"))  # fmt: skip
        assert not np.array_equal(down.numpy(), exact[f"blk.{i}.ffn_down_exps.weight"])
        rows = torch.stack((gate, up), dim=2).flatten(1, 2)  # interleaved again
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = rows.transpose(1, 2)
        state[f"model.layers.{i}.mlp.experts.down_proj"] = down.transpose(1, 2)
    hf.load_state_dict(state)
    torch.testing.assert_close(_logits(model), _logits(hf), atol=1e-4, rtol=0)


def test_a_gpt_oss_llama_cpp_cannot_run_is_refused_by_name(tmp_path: Path) -> None:
    """gpt-oss's own untruncated YaRN, and a clamp other than llama.cpp's 7.0."""
    for changes, facts in (
        ({"rope_parameters": {**CONFIG["rope_parameters"], "truncate": False}},
         ("as gpt-oss (gpt_oss)", "truncate=false")),
        ({"swiglu_limit": 0.5}, ("as gpt-oss (gpt_oss)", "limit=0.5")),
    ):  # fmt: skip
        hf_gpt_oss(**changes).save_pretrained(tmp_path / "hf")
        model = load_hf(tmp_path / "hf")
        with raises_naming(ConversionError, "cannot write this model as GGUF", *facts):
            save_gguf(model, tmp_path / "m.gguf")
        assert not (tmp_path / "m.gguf").exists()


def _fewer_experts(x: Any) -> Any:
    return x[:2]


HOSTILE = {
    "expert-shape": ({}, (), {"blk.1.ffn_up_exps.weight": _fewer_experts},
                     ("tensor blk.1.ffn_up_exps.weight has shape (2, 32, 64)", "(4, 32, 64)",
                      "4: gpt-oss.expert_count")),
    "bias-shape": ({}, (), {"blk.0.ffn_gate_exps.bias": lambda x: x[:, :16]},
                   ("tensor blk.0.ffn_gate_exps.bias has shape (4, 16)",
                    "32: gpt-oss.expert_feed_forward_length")),
    "missing-sinks": ({}, ("blk.1.attn_sinks.weight",), {},
                      ("missing (1): model.layers.1.self_attn.sinks",)),
    "missing-up": ({}, ("blk.0.ffn_up_exps.weight",), {}, ("blk.0.ffn_gate_exps.weight",)),
    "type-window": ({"attention.sliding_window": "4"}, (), {},
                    ("gpt-oss.attention.sliding_window",)),
    "type-experts": ({"expert_count": "4"}, (), {}, ("gpt-oss.expert_count",)),
    "rope-type": ({"rope.scaling.type": "longrope"}, (), {}, ("longrope",)),
}  # fmt: skip


@pytest.mark.parametrize("broken", HOSTILE, ids=HOSTILE.keys())
def test_a_broken_gpt_oss_file_is_refused_in_one_line(tmp_path: Path, broken: str) -> None:
    meta, drop, tensors, facts = HOSTILE[broken]
    path = write_gpt_oss(tmp_path / "m.gguf", hf_gpt_oss(), meta, drop=drop, tensors=tensors)
    with raises_naming(ConversionError, str(path), *facts) as caught:
        load_gguf(path)
    assert "\n" not in str(caught.value)
