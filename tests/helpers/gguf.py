"""GGUF files written as llama.cpp's converter writes them, by code here, not by lmcore."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

# ---------------------------------------------------------------------------------------------
# GGUF interop: files written as llama.cpp's converter writes them, by code here, not lmcore
# ---------------------------------------------------------------------------------------------


def needs_gguf() -> Any:
    """The `gguf` package; a module that calls this at import is skipped without the extra."""
    reason = "needs the 'gguf' extra: pip install -e '.[gguf]'"
    pytest.importorskip("jinja2", reason=reason)
    return pytest.importorskip("gguf", reason=reason)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Hello world, the cat sat on the mat.",
    "Numbers 12345 and 3.14159; emoji 🙂 and accents: café naïve.",
    "  leading spaces\n\nnew lines\ttabs   and trailing ",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "don't won't it's WE'LL THEY'RE",
]
GGUF_IDS = torch.tensor([[1, 5, 9, 2, 77, 31, 4, 100, 64, 12, 3, 8]])


def perturb_norms(model: Any) -> Any:
    """`model` with norm gains that are not all ones and biases that are not all zeros."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def hf_llama(d: int = 64, ff: int = 128, vocab: int = 128, tied: bool = False) -> Any:
    """A random transformers Llama, norms perturbed, two layers of 4 heads and 2 k/v heads."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=ff,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return perturb_norms(transformers.LlamaForCausalLM(config).eval())


def hf_qwen(model_type: str, head_dim: int | None = None) -> Any:
    """A tiny random Qwen 2 (q/k/v biases) or Qwen 3 (q/k norms), norms and biases perturbed."""
    import transformers

    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        **({} if head_dim is None else {"head_dim": head_dim}),
    )
    torch.manual_seed(0)
    return perturb_norms(transformers.AutoModelForCausalLM.from_config(config).eval())


def _add_shape(w: Any, c: Any, rope_theta: float = 10000.0) -> None:
    """The architecture's metadata of config `c`, as llama.cpp's converter writes it."""
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(rope_theta)
    w.add_rope_dimension_count(
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    )
    w.add_vocab_size(c.vocab_size)


def _permute(w: Any, heads: int) -> Any:
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _k_quant(rows: int, cols: int, qtype: Any, rng: Any) -> Any:
    """Random blocks of a K-quant (gguf's Python cannot quantize them), with sane f16 scales."""
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.0004], dtype=np.float16).view(np.uint8)
    at = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (size - 2,)}[qtype]
    for offset in at:
        raw[..., offset : offset + 2] = scale
    return raw.reshape(rows, -1)


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf: str) -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, i, module, *rest = hf.split(".")
    key = f"{module}.{rest[0]}" if module in ("self_attn", "mlp") else module
    return f"blk.{i}.{_GGUF_NAMES[key]}.weight"


def write_llama(
    path: Path,
    model: Any,
    qtype: Any = None,
    *,
    tokenizer: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """`model` as llama.cpp writes a Llama (`qtype`: a `gguf.GGMLQuantizationType`, F32 unless
    given); returns the weights the file holds, dequantized, in Hugging Face's names and row
    order (the reference)."""
    import gguf
    import numpy as np

    T = gguf.GGMLQuantizationType
    qtype = T.F32 if qtype is None else qtype
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    _add_shape(w, c)  # rope_theta as hf_llama sets it
    w.add_name("tiny")
    for key, value in (extra or {}).items():
        w.add_uint32(key, value)
    for key, value in (tokenizer or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    rng = np.random.default_rng(0)
    held = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        x = p.detach().numpy().astype(np.float32)
        if "q_proj" in name:
            x = _permute(x, c.num_attention_heads)
        elif "k_proj" in name:
            x = _permute(x, c.num_key_value_heads)
        kind = qtype if x.ndim == 2 else T.F32
        if kind in (T.Q4_K, T.Q5_K, T.Q6_K):
            raw = _k_quant(*x.shape, kind, rng)
        else:
            raw = gguf.quants.quantize(x, kind)
        w.add_tensor(_gguf_name(name), raw, raw_dtype=None if kind in (T.F32, T.F16) else kind)
        back = gguf.quants.dequantize(raw, kind).reshape(x.shape).astype(np.float32)
        if "q_proj" in name or "k_proj" in name:  # undo the permutation: rows move whole
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            inverse = np.argsort(_permute(np.arange(x.shape[0]), heads))
            back = back[inverse]
        held[name] = torch.from_numpy(back.copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def write_by_gguf_map(path: Path, model: Any, arch: Any) -> None:
    """`model` in float32 under the tensor names gguf's own map gives (llama.cpp's converter
    uses it), rows as Hugging Face holds them: Qwen's converters do not permute q and k."""
    import gguf
    import numpy as np

    c = model.config
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    _add_shape(w, c)  # rope_theta as hf_qwen sets it
    if arch == gguf.MODEL_ARCH.QWEN3:
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    names = gguf.get_tensor_name_map(arch, c.num_hidden_layers)
    for name, p in model.state_dict().items():
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        w.add_tensor(target, p.detach().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference_logits(model: Any, held: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The transformers model's logits with the weights a GGUF file holds (`write_llama`)."""
    model.load_state_dict(held, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def byte_level_bpe() -> Any:
    """A SmolLM-style tokenizer: digits split one by one, then GPT-2's byte-level BPE."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def ggml_tokenizer(tok: Any) -> dict[str, Any]:
    """`tokenizer.ggml.*` as llama.cpp's converter writes them for a byte-level BPE."""
    config = json.loads(tok.to_str())
    vocab = tok.get_vocab()
    by_id = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in config["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in config["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": by_id,
        "tokenizer.ggml.token_type": [3 if t in special else 1 for t in by_id],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": vocab["<|im_start|>"],
        "tokenizer.ggml.eos_token_id": vocab["<|im_end|>"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


# ---------------------------------------------------------------------------------------------
# A tiny GGUF Llama of random weights, broken one way at a time (the hostile-input tests)
# ---------------------------------------------------------------------------------------------

TINY: dict[str, Any] = {  # d_model 32, 4 heads of 8, 2 key/value heads, 2 layers, vocabulary 300
    "general.name": "tiny",
    "llama.block_count": 2,
    "llama.context_length": 64,
    "llama.embedding_length": 32,
    "llama.feed_forward_length": 64,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.rope.freq_base": 10000.0,
    "llama.rope.dimension_count": 8,
    "llama.vocab_size": 300,
}
TINY_SHAPES: dict[str, tuple[int, ...]] = {
    "token_embd.weight": (300, 32),
    "output_norm.weight": (32,),
    "output.weight": (300, 32),
    **{
        f"blk.{i}.{name}.weight": shape
        for i in range(2)
        for name, shape in (
            ("attn_norm", (32,)),
            ("ffn_norm", (32,)),
            ("attn_q", (32, 32)),
            ("attn_k", (16, 32)),
            ("attn_v", (16, 32)),
            ("attn_output", (32, 32)),
            ("ffn_gate", (64, 32)),
            ("ffn_up", (64, 32)),
            ("ffn_down", (32, 64)),
        )
    },
}


def tiny_gguf(
    path: Path,
    meta: dict[str, Any] | None = None,
    *,
    drop: tuple[str, ...] = (),
    tensors: dict[str, Any] | None = None,
) -> Path:
    """A two-layer Llama of seeded random float32 weights with the byte-level BPE of
    `byte_level_bpe` and ChatML, as llama.cpp writes them; `meta` replaces or adds keys (typed
    by value: a negative int as int32, a non-negative one as uint32), `drop` leaves keys out,
    `tensors`: GGUF name -> f(array) -> the array written instead."""
    import gguf
    import numpy as np

    T = gguf.GGUFValueType
    fields = {**TINY, **ggml_tokenizer(byte_level_bpe()), **(meta or {})}
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in fields.items():
        if key in drop:
            continue
        if isinstance(value, list):
            w.add_array(key, value)
            continue
        kind = (
            T.BOOL if isinstance(value, bool)
            else T.FLOAT32 if isinstance(value, float)
            else T.STRING if isinstance(value, str)
            else T.INT32 if value < 0
            else T.UINT32
        )  # fmt: skip
        w.add_key_value(key, value, kind)
    rng = np.random.default_rng(0)
    for name, shape in TINY_SHAPES.items():
        x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if tensors and name in tensors:
            x = np.ascontiguousarray(tensors[name](x), dtype=np.float32)
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def huge_array(path: Path, items: int = 2**62, zeros: int = 2**20) -> Path:
    """A GGUF header whose string array general.tags claims `items` items, then `zeros`
    zero bytes (empty strings to read, as far as the file goes)."""
    import struct

    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    kv = [
        (b"general.architecture", struct.pack("<I", 8) + s(b"llama")),
        (b"general.tags", struct.pack("<IIQ", 9, 8, items)),
    ]
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv))
    path.write_bytes(header + b"".join(s(k) + v for k, v in kv) + bytes(zeros))
    return path


# ---------------------------------------------------------------------------------------------
# Every architecture as llama.cpp's converter (convert_hf_to_gguf.py) writes it, by code here
# ---------------------------------------------------------------------------------------------

_TINY_SIZES: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
# GGUF architecture case -> (model_type, config): tiny, every feature the architecture stores
GGUF_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", dict(_TINY_SIZES, rope_theta=5000.0)),
    "mixtral": ("mixtral", dict(_TINY_SIZES, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("qwen2", dict(_TINY_SIZES)),
    # heads wider than d_model / heads; transformers' loader reads no head_dim for qwen3 (its
    # default is 128), no expert width for qwen3moe (768), no n_positions for gpt2 (1024)
    "qwen3": ("qwen3", dict(_TINY_SIZES, head_dim=128)),
    "qwen3moe": ("qwen3_moe", dict(_TINY_SIZES, num_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=768, head_dim=16, norm_topk_prob=True)),
    "gemma": ("gemma", dict(_TINY_SIZES, head_dim=16)),
    # heads 256 wide and the default soft caps: what transformers' GGUF loader assumes too
    "gemma2": ("gemma2", dict(_TINY_SIZES, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=256, query_pre_attn_scalar=256, sliding_window=4)),
    # six layers: five local (window 4, base 10,000), the sixth global
    "gemma3": ("gemma3_text", dict(_TINY_SIZES, num_hidden_layers=6, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=256, sliding_window=4)),
    "gemma3-scaled": ("gemma3_text", dict(_TINY_SIZES, num_hidden_layers=6, head_dim=16,
                                          query_pre_attn_scalar=16, sliding_window=4,
                                          rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "phi3": ("phi3", dict(_TINY_SIZES, pad_token_id=0)),
    "phi3-partial": ("phi3", dict(_TINY_SIZES, partial_rotary_factor=0.5, sliding_window=5,
                                  pad_token_id=0)),
    "olmo2": ("olmo2", dict(_TINY_SIZES)),
    "gpt2": ("gpt2", dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=1024)),
    "gptneox": ("gpt_neox", dict(vocab_size=128, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 max_position_embeddings=64, rotary_pct=0.5)),
    # four layers: the fourth rotates nothing (llama.cpp's fixed step of 4)
    "smollm3": ("smollm3", dict(_TINY_SIZES, num_hidden_layers=4, pad_token_id=0,
                                bos_token_id=1, eos_token_id=2)),
    # DeltaNet layers 0 and 2 (two key heads, four value heads), gated attention on 1 and 3
    "qwen3next": ("qwen3_next", dict(_TINY_SIZES, num_hidden_layers=4, full_attention_interval=2,
                                     head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                                     linear_key_head_dim=8, linear_value_head_dim=12,
                                     num_experts=4, num_experts_per_tok=2,
                                     moe_intermediate_size=24, shared_expert_intermediate_size=20,
                                     norm_topk_prob=True, pad_token_id=0)),
    # Mamba-2 alone: 16 SSM heads of 8 over two groups (expand 2, as the converter requires)
    "mamba2": ("mamba2", dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=16,
                              head_dim=8, state_size=8, n_groups=2, chunk_size=8)),
    # OLMo 3 as llama.cpp writes it (olmo2 with a window): layers 0-2 slide, 3 is full; one base
    "olmo3": ("olmo3", dict(_TINY_SIZES, num_hidden_layers=4, sliding_window=4, pad_token_id=0,
                            eos_token_id=2, rope_parameters={
                                t: {"rope_type": "default", "rope_theta": 5000.0}
                                for t in ("sliding_attention", "full_attention")})),
    # convolution layers 0 and 2 (head_count_kv 0), the width adjusted as transformers does
    "lfm2": ("lfm2", dict(_TINY_SIZES, num_hidden_layers=3, intermediate_size=120,
                          block_multiple_of=16, block_ffn_dim_multiplier=1.3,
                          layer_types=["conv", "full_attention", "conv"], pad_token_id=0,
                          bos_token_id=1, eos_token_id=2)),
    # Falcon-H1: every multiplier away from 1 (the converter folds them into the weights), the
    # gate before the grouped norm and no biases but the convolution's (llama.cpp's graph)
    "falcon-h1": ("falcon_h1", dict(_TINY_SIZES, head_dim=16, mamba_d_ssm=48, mamba_n_heads=6,
                                    mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8,
                                    mamba_chunk_size=8, mamba_rms_norm=True,
                                    mamba_norm_before_gate=False, mamba_proj_bias=False,
                                    projectors_bias=False, key_multiplier=0.7,
                                    embedding_multiplier=1.5, lm_head_multiplier=0.8,
                                    mlp_multipliers=[0.9, 0.6], attention_in_multiplier=1.2,
                                    attention_out_multiplier=0.8, ssm_in_multiplier=0.9,
                                    ssm_out_multiplier=1.1,
                                    ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 0.7], rope_theta=500.0)),
}  # fmt: skip
# The cases transformers' GGUF loader reads (integrations/ggml.py: GGUF_CONFIG_MAPPING); it
# reads neither gemma, olmo2, gptneox nor a llama with experts, nor a partial rotation of Phi-3.
TRANSFORMERS_READS = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt2",
                      "lfm2")


def hf_case(case: str) -> Any:
    """The tiny random transformers model of `GGUF_CASES[case]`, norms and biases perturbed."""
    import transformers

    model_type, sizes = GGUF_CASES[case]
    config = transformers.AutoConfig.for_model(model_type, **sizes)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return perturb_norms(model.eval())


def arch_of(case: str) -> str:
    return {"mixtral": "llama", "phi3-partial": "phi3", "gemma3-scaled": "gemma3",
            "olmo3": "olmo2"}.get(case, case)  # fmt: skip


def _metadata(case: str, c: Any) -> dict[str, Any]:
    """The architecture's metadata as the converter's set_gguf_parameters writes it."""
    arch = arch_of(case)
    if arch == "gpt2":
        return {"block_count": c.n_layer, "context_length": c.n_positions,
                "embedding_length": c.n_embd, "feed_forward_length": 4 * c.n_embd,
                "attention.head_count": c.n_head,
                "attention.layer_norm_epsilon": c.layer_norm_epsilon}  # fmt: skip
    if arch == "mamba2":  # Mamba2Model.set_gguf_parameters
        inner = c.expand * c.hidden_size
        return {"context_length": 2**20, "embedding_length": c.hidden_size,
                "feed_forward_length": 0, "attention.head_count": 0,
                "block_count": c.num_hidden_layers, "ssm.conv_kernel": c.conv_kernel,
                "ssm.inner_size": inner, "ssm.state_size": c.state_size,
                "ssm.time_step_rank": inner // c.head_dim, "ssm.group_count": c.n_groups,
                "attention.layer_norm_rms_epsilon": c.layer_norm_epsilon}  # fmt: skip
    if arch == "falcon-h1":  # FalconH1Model.set_gguf_parameters over Mamba2Model's
        return {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
                "feed_forward_length": c.intermediate_size,
                "attention.head_count": c.num_attention_heads, "block_count": c.num_hidden_layers,
                "ssm.conv_kernel": c.mamba_d_conv, "ssm.inner_size": c.mamba_d_ssm,
                "ssm.state_size": c.mamba_d_state,
                "ssm.time_step_rank": c.mamba_d_ssm // c.mamba_d_head,
                "ssm.group_count": c.mamba_n_groups,
                "attention.layer_norm_rms_epsilon": c.rms_norm_eps, "vocab_size": c.vocab_size,
                "attention.head_count_kv": c.num_key_value_heads,
                "attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
                "rope.freq_base": float(c.rope_parameters["rope_theta"])}  # fmt: skip
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    meta: dict[str, Any] = {
        "block_count": c.num_hidden_layers,
        "context_length": c.max_position_embeddings,
        "embedding_length": c.hidden_size,
        "feed_forward_length": c.intermediate_size,
        "attention.head_count": c.num_attention_heads,
    }
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)  # Gemma 3's global layers
    theta = float(rope["rope_theta"])
    if arch == "gptneox":
        pct = c.rope_parameters.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0))
        return {**meta, "rope.dimension_count": int(pct * head_dim),
                "use_parallel_residual": c.use_parallel_residual,
                "attention.layer_norm_epsilon": c.layer_norm_eps}  # fmt: skip
    if arch == "lfm2":  # LFM2Model.set_gguf_parameters
        ff = int(2 * c.intermediate_size / 3) if c.block_auto_adjust_ff_dim else c.intermediate_size
        if c.block_auto_adjust_ff_dim and c.block_ffn_dim_multiplier is not None:
            ff = int(c.block_ffn_dim_multiplier * ff)
            ff = c.block_multiple_of * ((ff + c.block_multiple_of - 1) // c.block_multiple_of)
        return {**meta, "feed_forward_length": ff, "rope.freq_base": theta,
                "attention.head_count_kv": [0 if t == "conv" else c.num_key_value_heads
                                            for t in c.layer_types],
                "attention.layer_norm_rms_epsilon": c.norm_eps, "vocab_size": c.vocab_size,
                "shortconv.l_cache": c.conv_L_cache}  # fmt: skip
    meta["attention.head_count_kv"] = c.num_key_value_heads
    meta["attention.layer_norm_rms_epsilon"] = c.rms_norm_eps
    if arch == "gemma3":  # Gemma3Model.set_gguf_parameters
        meta |= {"attention.key_length": head_dim, "attention.value_length": head_dim,
                 "attention.sliding_window": c.sliding_window, "rope.freq_base": theta}  # fmt: skip
        if rope.get("rope_type", "default") == "linear":
            meta |= {"rope.scaling.type": "linear", "rope.scaling.factor": rope["factor"]}
        return meta
    if arch in ("gemma", "gemma2"):
        meta |= {"attention.key_length": head_dim, "attention.value_length": head_dim}
        if arch == "gemma2":
            meta |= {"attn_logit_softcapping": c.attn_logit_softcapping,
                     "final_logit_softcapping": c.final_logit_softcapping,
                     "attention.sliding_window": c.sliding_window}  # fmt: skip
        return meta
    meta["rope.freq_base"] = theta
    if case == "olmo3":  # Olmo2Model.set_gguf_parameters
        meta |= {"attention.sliding_window": c.sliding_window,
                 "attention.sliding_window_pattern": [t == "sliding_attention"
                                                      for t in c.layer_types]}  # fmt: skip
    if arch == "phi3":
        pct = c.rope_parameters.get("partial_rotary_factor", 1.0)
        return {**meta, "rope.dimension_count": int(pct * c.hidden_size) // c.num_attention_heads,
                "rope.scaling.original_context_length": c.original_max_position_embeddings,
                "attention.sliding_window": c.sliding_window or 0}  # fmt: skip
    if arch in ("llama", "mixtral", "smollm3"):  # LlamaModel.set_gguf_parameters
        meta |= {"vocab_size": c.vocab_size, "rope.dimension_count": head_dim}
    if arch in ("qwen3", "qwen3moe"):
        meta |= {"attention.key_length": head_dim, "attention.value_length": head_dim}
    if arch == "qwen3next":  # Qwen3NextModel.set_gguf_parameters
        meta |= {"attention.key_length": head_dim, "attention.value_length": head_dim,
                 "expert_shared_feed_forward_length": c.shared_expert_intermediate_size,
                 "ssm.conv_kernel": c.linear_conv_kernel_dim,
                 "ssm.state_size": c.linear_key_head_dim,
                 "ssm.group_count": c.linear_num_key_heads,
                 "ssm.time_step_rank": c.linear_num_value_heads,
                 "ssm.inner_size": c.linear_value_head_dim * c.linear_num_value_heads,
                 "full_attention_interval": c.layer_types.index("full_attention") + 1,
                 "rope.dimension_count": int(head_dim * c.rope_parameters.get(
                     "partial_rotary_factor", 0.25))}  # fmt: skip
    experts = getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None)
    if experts:
        meta |= {"expert_count": experts, "expert_used_count": c.num_experts_per_tok}
    if arch in ("qwen3moe", "qwen3next"):
        meta["expert_feed_forward_length"] = c.moe_intermediate_size
    return meta


def _converted(case: str, model: Any) -> dict[str, Any]:
    """The model's tensors (numpy float32) under GGUF's names, changed as the converter's
    modify_tensors changes them, named by gguf's own tensor map."""
    import gguf
    import numpy as np

    arch, c = arch_of(case), model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper().replace("-", "_")], 64)
    out: dict[str, Any] = {}
    for name, p in model.state_dict().items():
        x = p.detach().float()
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")):
            continue
        if ".experts.gate_up_proj" in name or ".experts.down_proj" in name:  # stack 3-D
            at = name.split(".mlp.")[0].replace("model.layers.", "blk.")
            if "gate_up" in name:
                gate, up = x.chunk(2, dim=1)
                out[f"{at}.ffn_gate_exps.weight"], out[f"{at}.ffn_up_exps.weight"] = gate, up
            else:
                out[f"{at}.ffn_down_exps.weight"] = x
            continue
        if arch in ("gemma", "gemma2", "gemma3") and name.endswith("norm.weight"):
            x = x + 1
        if arch == "qwen3next":  # Qwen3NextModel.modify_tensors
            if name.endswith(".A_log"):
                x = -torch.exp(x)
            elif name.endswith(".dt_bias"):
                name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
            elif "conv1d" in name:
                x = x.squeeze()
            elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                x = x + 1
            if "in_proj_qkvz" in name:
                nk, hk = c.linear_num_key_heads, c.linear_key_head_dim
                hv = c.linear_num_value_heads // nk * c.linear_value_head_dim
                q, k, v, z = x.T.reshape(c.hidden_size, nk, -1).split([hk, hk, hv, hv], dim=-1)
                flat = [t.reshape(c.hidden_size, -1) for t in (q, k, v, z)]
                at = name.split(".linear_attn.")[0].replace("model.layers.", "blk.")
                out[f"{at}.attn_qkv.weight"] = torch.cat(flat[:3], dim=-1).T.numpy()
                out[f"{at}.attn_gate.weight"] = flat[3].T.numpy()
                continue
        if arch == "mamba2":  # Mamba2Model.filter_tensors, modify_tensors
            name = name.replace(".dt_bias", ".dt_proj.bias")
            if "conv1d.weight" in name:
                x = x.squeeze()
            elif name.endswith((".A_log", ".D")):
                x = x.reshape(*x.shape, 1)
            elif name.endswith("mixer.norm.weight"):
                x = x.reshape(c.n_groups, -1)
            if name.endswith(".A_log"):
                x = -torch.exp(x)
        if arch == "falcon-h1":  # FalconH1Model.modify_tensors, after Mamba2Model's
            name = name.replace(".dt_bias", ".dt_proj.bias")
            if "conv1d.weight" in name:
                x = x.squeeze()
            elif name.endswith((".A_log", ".D")):
                x = x.reshape(*x.shape, 1)
            if name.endswith(".A_log"):
                x = -torch.exp(x)
            inner, gs = c.mamba_d_ssm, c.mamba_n_groups * c.mamba_d_state
            if "down_proj" in name:
                x = x * c.mlp_multipliers[1]
            elif "gate_proj" in name:
                x = x * c.mlp_multipliers[0]
            elif "k_proj" in name:
                x = x * c.key_multiplier * c.attention_in_multiplier
            elif "q_proj" in name or "v_proj" in name:
                x = x * c.attention_in_multiplier
            elif "o_proj" in name:
                x = x * c.attention_out_multiplier
            elif "out_proj" in name:
                x = x * c.ssm_out_multiplier
            elif "in_proj" in name:
                x = x * c.ssm_in_multiplier
                m = c.ssm_multipliers
                x[:inner] *= m[0]
                x[inner:2 * inner] *= m[1]
                x[2 * inner:2 * inner + gs] *= m[2]
                x[2 * inner + gs:2 * inner + 2 * gs] *= m[3]
                x[2 * inner + 2 * gs:] *= m[4]
            elif "lm_head" in name:
                x = x * c.lm_head_multiplier
            elif "embed_tokens" in name:
                x = x * c.embedding_multiplier
            elif "mamba.norm" in name:
                x = x.reshape(c.mamba_n_groups, inner // c.mamba_n_groups)
        if arch == "lfm2" and name.endswith("conv.conv.weight"):  # a 2-D filter for ssm_conv
            x = x.squeeze(1)
        if arch == "gpt2" and name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
            x = x.T
        if arch == "gptneox" and "query_key_value" in name:
            heads = c.num_attention_heads
            x = x.reshape(heads, 3, -1, *x.shape[1:]).transpose(0, 1).reshape(x.shape)
        if arch in ("llama", "smollm3") and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            x = torch.from_numpy(_permute(x.numpy(), heads))
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        out[target] = np.ascontiguousarray(x.numpy(), dtype=np.float32)
    return {k: np.ascontiguousarray(np.asarray(v), dtype=np.float32) for k, v in out.items()}


def write_as_llama_cpp(path: Path, case: str, model: Any, meta: dict[str, Any] | None = None,
                       *, drop: tuple[str, ...] = (), tensors: dict[str, Any] | None = None
                       ) -> Path:  # fmt: skip
    """`model` (a `hf_case`) as llama.cpp's converter writes architecture `case`; `meta`
    replaces or adds metadata ("{arch}."-relative keys; a value of the wrong type is written as
    given), `drop` leaves keys or tensors out, `tensors`: GGUF name -> f(array) -> the array
    written instead."""
    import gguf
    import numpy as np

    arch = arch_of(case)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    T = gguf.GGUFValueType
    fields = {**_metadata(case, model.config), **(meta or {})}
    for key, value in fields.items():
        if key in drop:
            continue
        if isinstance(value, list):  # per-layer values (LFM2's head_count_kv)
            w.add_array(f"{arch}.{key}", value)
            continue
        kind = (
            T.BOOL if isinstance(value, bool)
            else T.FLOAT32 if isinstance(value, float)
            else T.STRING if isinstance(value, str)
            else T.UINT32
        )  # fmt: skip
        w.add_key_value(f"{arch}.{key}", value, kind)
    # the vocabulary, for transformers' loader to size the embeddings by (no tokenizer.ggml.model:
    # the model converts without a tokenizer)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(model.config.vocab_size)])
    if getattr(model.config, "pad_token_id", None) is not None:  # else transformers' Phi-3 32000
        w.add_uint32("tokenizer.ggml.padding_token_id", model.config.pad_token_id)
    for name, x in _converted(case, model).items():
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


SPM_SPECIALS = ["<unk>", "<s>", "</s>"]


def sentencepiece_bpe(prefix: bool = True) -> Any:
    """A Llama-2-style tokenizer.json (what transformers' converter makes of a SentencePiece
    BPE model): <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> for byte fallback, then
    pieces in merge order; spaces as "▁" (and one before the text, `prefix`) by its normalizer,
    no pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers

    space = "\u2581"
    spaces = [normalizers.Replace(" ", space)]
    norm = normalizers.Sequence([normalizers.Prepend(space), *spaces] if prefix else spaces)
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = norm
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=[])
    trainer_tok.train_from_iterator([line for line in CORPUS * 20 if "<|" not in line], trainer)
    trained = trainer_tok.model
    learned = json.loads(trainer_tok.to_str())["model"]
    pieces = sorted(learned["vocab"], key=learned["vocab"].__getitem__)
    tokens = [*SPM_SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    del trained
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))  # fmt: skip
    tok.normalizer = norm
    steps = [decoders.Replace(space, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPM_SPECIALS])
    return tok


def ggml_sentencepiece(tok: Any, prefix: bool = True) -> dict[str, Any]:
    """`tokenizer.ggml.*` as llama.cpp's converter writes a SentencePiece vocabulary: each
    piece's score (SentencePiece's BPE scores: minus its position, so earlier merges score
    higher), types 2 unknown, 3 control, 6 byte, 1 normal; no merges."""
    vocab = tok.get_vocab()
    by_id = sorted(vocab, key=vocab.__getitem__)

    def kind(t: str) -> int:
        return 2 if t == "<unk>" else 3 if t in SPM_SPECIALS else 6 if t.startswith("<0x") else 1

    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": by_id,
        "tokenizer.ggml.scores": [0.0 if kind(t) != 1 else -float(i) for i, t in enumerate(by_id)],
        "tokenizer.ggml.token_type": [kind(t) for t in by_id],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": prefix,
        "tokenizer.ggml.add_bos_token": True,
    }
