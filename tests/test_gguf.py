"""GGUF in and out (`lmcore.gguf`), on tiny files the tests write themselves with gguf's writer.

The reference for reading is transformers' Llama with the very weights the file holds (each
tensor quantized and dequantized by `gguf.quants`, in Hugging Face's row order); the files are
written the way llama.cpp's converter writes them (q/k rows permuted, `tokenizer.ggml.*`), by
code here, not by lmcore. Writing is checked by reading back with `gguf.GGUFReader` and by
loading with transformers' own GGUF loader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="needs the 'gguf' extra: pip install -e '.[gguf]'")
pytest.importorskip("jinja2", reason="needs the 'gguf' extra: pip install -e '.[gguf]'")
transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

import lmcore  # noqa: E402
from lmcore.cli.chat import Conversation  # noqa: E402
from lmcore.cli.main import main  # noqa: E402
from lmcore.errors import ConversionError  # noqa: E402
from lmcore.gguf import convert_from_gguf, load_gguf, read_gguf, save_gguf  # noqa: E402
from lmcore.gguf.tokenizer import from_gguf_metadata, to_gguf_metadata  # noqa: E402
from lmcore.model.generate import GREEDY  # noqa: E402
from lmcore.tokenizer import SavedTokenizer  # noqa: E402

T = gguf.GGMLQuantizationType
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


def hf_llama(d: int = 64, ff: int = 128, vocab: int = 128, tied: bool = False) -> Any:
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
    return perturbed(transformers.LlamaForCausalLM(config).eval())


def perturbed(model: Any) -> Any:
    """`model` with norm gains that are not all ones and biases that are not all zeros."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def add_shape(w: Any, c: Any, rope_theta: float = 10000.0) -> None:
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


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def k_quant(rows: int, cols: int, qtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant (gguf's Python cannot quantize them), with sane f16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.array([0.0004], dtype=np.float16).view(np.uint8)
    at = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (size - 2,)}[qtype]
    for offset in at:
        raw[..., offset : offset + 2] = scale
    return raw.reshape(rows, -1)


GGUF_NAMES = {
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


def gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, i, module, *rest = hf.split(".")
    key = f"{module}.{rest[0]}" if module in ("self_attn", "mlp") else module
    return f"blk.{i}.{GGUF_NAMES[key]}.weight"


def write_llama(
    path: Path,
    model: Any,
    qtype: Any = T.F32,
    *,
    tokenizer: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, torch.Tensor]:
    """`model` as llama.cpp writes a Llama; returns the weights the file holds, dequantized,
    in Hugging Face's names and row order (the reference)."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    add_shape(w, c)  # rope_theta as hf_llama sets it
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
            x = permute(x, c.num_attention_heads)
        elif "k_proj" in name:
            x = permute(x, c.num_key_value_heads)
        kind = qtype if x.ndim == 2 else T.F32
        if kind in (T.Q4_K, T.Q5_K, T.Q6_K):
            raw = k_quant(*x.shape, kind, rng)
        else:
            raw = gguf.quants.quantize(x, kind)
        w.add_tensor(gguf_name(name), raw, raw_dtype=None if kind in (T.F32, T.F16) else kind)
        back = gguf.quants.dequantize(raw, kind).reshape(x.shape).astype(np.float32)
        if "q_proj" in name or "k_proj" in name:  # undo the permutation: rows move whole
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            inverse = np.argsort(permute(np.arange(x.shape[0]), heads))
            back = back[inverse]
        held[name] = torch.from_numpy(back.copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def reference_logits(model: Any, held: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    model.load_state_dict(held, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


IDS = torch.tensor([[1, 5, 9, 2, 77, 31, 4, 100, 64, 12, 3, 8]])


@pytest.mark.parametrize(
    "qtype, d",
    [
        (T.F32, 64),
        (T.F16, 64),
        (T.BF16, 64),
        (T.Q8_0, 64),
        (T.Q4_0, 64),
        (T.Q4_1, 64),
        (T.Q5_1, 64),
        (T.Q4_K, 256),
        (T.Q5_K, 256),
        (T.Q6_K, 256),
    ],
)
def test_a_gguf_llama_gives_the_logits_of_the_weights_it_holds(
    tmp_path: Path, qtype: Any, d: int
) -> None:
    hf = hf_llama(d=d, ff=256 if d == 256 else 128)
    held = write_llama(tmp_path / "m.gguf", hf, qtype)
    model = load_gguf(tmp_path / "m.gguf", dtype=torch.float32)
    assert model.spec.num_kv_heads == 2 and model.spec.d_model == d
    assert not model.spec.tie_embeddings
    with torch.no_grad():
        ours = model(IDS)
    torch.testing.assert_close(ours, reference_logits(hf, held, IDS), atol=1e-4, rtol=0)


def test_a_gguf_without_output_weight_is_tied(tmp_path: Path) -> None:
    hf = hf_llama(tied=True)
    held = write_llama(tmp_path / "m.gguf", hf, T.Q8_0)
    model = load_gguf(tmp_path / "m.gguf")
    assert model.spec.tie_embeddings
    assert model.lm_head.weight is model.token_embeddings.weight
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), reference_logits(hf, held, IDS), atol=1e-4, rtol=0)


def test_unknown_or_inexpressible_metadata_is_refused_by_name(tmp_path: Path) -> None:
    write_llama(tmp_path / "m.gguf", hf_llama(), extra={"llama.mystery_knob": 3})
    with pytest.raises(ConversionError, match=r"llama\.mystery_knob .*--ignore-field"):
        load_gguf(tmp_path / "m.gguf")
    assert load_gguf(tmp_path / "m.gguf", ignore=["llama.mystery_knob"]).spec.num_layers == 2
    write_llama(tmp_path / "e.gguf", hf_llama(), extra={"llama.expert_count": 8})
    with pytest.raises(ConversionError, match=r"llama\.expert_count=8 \(lmcore converts 0 only\)"):
        load_gguf(tmp_path / "e.gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ConversionError, match="is not a GGUF file"):
        read_gguf(tmp_path / "x.gguf")


# ------------------------------------------------------------------------------ tokenizer


def byte_level_bpe() -> Tokenizer:
    """A SmolLM-style tokenizer: digits split one by one, then GPT-2's byte-level BPE."""
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


def ggml_tokenizer(tok: Tokenizer) -> dict[str, Any]:
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


def test_the_gguf_tokenizer_tokenizes_as_the_original(tmp_path: Path) -> None:
    tok = byte_level_bpe()
    meta = ggml_tokenizer(tok)
    saved = from_gguf_metadata(meta, "t.gguf")
    assert saved is not None
    rebuilt = saved.tokenizer()
    text = "\n".join(CORPUS) + " 2024-06-01 x1y22z333 ÆØÅ   \n\t!"
    for line in [*CORPUS, text]:
        assert rebuilt.encode(line).ids == tok.encode(line).ids, line
        assert rebuilt.decode(tok.encode(line).ids) == tok.decode(tok.encode(line).ids)
    assert saved.eos_token_id == tok.token_to_id("<|im_end|>")
    assert set(saved.stop_token_ids) == {
        tok.token_to_id("<|im_end|>"),
        tok.token_to_id("<|endoftext|>"),
    }
    assert saved.chat_template == CHATML
    back = to_gguf_metadata(saved, 300)  # and the way back gives what llama.cpp wrote
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert back[key] == meta[key]
    with pytest.raises(ConversionError, match=r"tokenizer\.ggml\.pre='mystery'"):
        from_gguf_metadata({**meta, "tokenizer.ggml.pre": "mystery"}, "t.gguf")


def test_convert_from_gguf_stores_the_tokenizer_and_chat_stops_at_end_of_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = byte_level_bpe()
    hf = hf_llama(vocab=300)
    write_llama(tmp_path / "m.gguf", hf, T.Q8_0, tokenizer=ggml_tokenizer(tok))
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-gguf", str(tmp_path / "m.gguf"), str(out)]) == 0
    assert "tokenizer: stored" in capsys.readouterr().out
    info = lmcore.read_info(out)
    assert info.tokenizer is not None and info.tokenizer.chat_template == CHATML
    assert json.loads(info.metadata["gguf.metadata"])["general.name"] == "tiny"
    end = tok.token_to_id("<|im_end|>")
    model = lmcore.load(out)
    with torch.no_grad():  # make the model answer "<|im_end|>" after two tokens of anything
        model.lm_head.weight.zero_()
    saved = model.tokenizer
    assert saved is not None
    chat = Conversation(model, saved, saved.tokenizer())
    with torch.no_grad():
        model.lm_head.weight[end] = 1.0
        model.ln_final.weight.fill_(1.0)
    written: list[str] = []
    reply = chat.turn("Hi there", written.append, GREEDY, show_special=True)
    assert reply == [end] and "".join(written) == "<|im_end|>"
    first = len(chat.cached)
    chat.turn("again", written.append, GREEDY)
    assert chat.kv is not None and chat.kv.length == len(chat.cached) > first
    capsys.readouterr()
    edited = model.save(tmp_path / "edited.safetensors")  # keeps the model's tokenizer
    args = ["generate", str(edited), "--chat", "Hi", "--temperature", "0"]
    assert main([*args, "--show-special"]) == 0  # no --tokenizer; stops at <|im_end|>
    shown = capsys.readouterr()
    assert f"1 tokens (stop token {end})" in shown.err and shown.out == "<|im_end|>\n"
    assert main(args) == 0
    assert capsys.readouterr().out == "\n"  # special tokens hidden by default


def test_chat_continues_its_kv_cache_as_a_fresh_run_would(tmp_path: Path) -> None:
    tok = byte_level_bpe()
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=CHATML, eos_token_id=2)
    torch.manual_seed(0)
    model = lmcore.build_model(
        "vocab_size=300,context_length=256,d_model=32,num_layers=2,num_heads=2,d_ff=64"
    )
    chat = Conversation(model, saved, tok)
    chat.turn("Hello", lambda _: None, GREEDY, max_new_tokens=8)
    second = chat.turn("the cat", lambda _: None, GREEDY, max_new_tokens=8)
    prompt = tok.encode(
        saved.render_chat(chat.messages[:-1], tokenizer=tok), add_special_tokens=False
    ).ids
    fresh = model.generate(torch.tensor(prompt), 8, GREEDY, stop_token=[2, 0])
    assert second == fresh.tolist()


# ------------------------------------------------------------------------------ writing


@pytest.mark.parametrize("kind, tolerance", [("f32", 1e-4), ("f16", 2e-2), ("q8_0", 5e-2)])
def test_to_gguf_loads_in_transformers_with_lmcore_s_logits(
    tmp_path: Path, kind: str, tolerance: float
) -> None:
    torch.manual_seed(0)
    spec = "vocab_size=300,context_length=64,d_model=64,num_layers=2,num_heads=4,num_kv_heads=2,d_ff=128"
    model = lmcore.build_model(spec)
    model.tokenizer = SavedTokenizer.from_tokenizer(byte_level_bpe(), chat_template=CHATML)
    ckpt = model.save(tmp_path / "m.safetensors")
    assert main(["convert", "--to-gguf", str(ckpt), str(tmp_path / "m.gguf"), "--type", kind]) == 0
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == kind.upper() and types["output_norm.weight"] == "F32"
    assert "tokenizer.ggml.merges" in reader.fields and "output.weight" in types
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="m.gguf", dtype=torch.float32
    )
    ids = IDS % 300
    with torch.no_grad():
        theirs, ours = hf(ids).logits, model(ids)
        again = load_gguf(tmp_path / "m.gguf", dtype=torch.float32)(ids)  # the file, read back
    torch.testing.assert_close(theirs, again, atol=1e-4, rtol=0)
    torch.testing.assert_close(theirs, ours, atol=tolerance, rtol=0)
    roundtrip = load_gguf(tmp_path / "m.gguf").tokenizer
    assert roundtrip is not None and roundtrip.chat_template == CHATML


def test_save_gguf_refuses_what_llama_cannot_hold(tmp_path: Path) -> None:
    model = lmcore.build_model(
        "vocab_size=64,context_length=16,d_model=32,num_layers=1,num_heads=2,pos=nope"
    )
    with pytest.raises(ConversionError, match="nope"):
        save_gguf(model, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    with pytest.raises(ConversionError, match=r"--type 'q2'"):
        save_gguf(lmcore.build_model("cs336-tiny"), tmp_path / "m.gguf", type="q2")


def test_convert_from_gguf_writes_a_checkpoint_lmcore_loads(tmp_path: Path) -> None:
    hf = hf_llama()
    held = write_llama(tmp_path / "m.gguf", hf, T.F16)
    out = convert_from_gguf(tmp_path / "m.gguf", tmp_path / "m.safetensors")
    assert lmcore.read_info(out).dtype == "float16"
    model = lmcore.load(out, dtype=torch.float32)
    # the F32 norm gains are stored float16 with the rest: 1e-3, not 1e-4
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), reference_logits(hf, held, IDS), atol=1e-3, rtol=0)


def test_convert_s_gguf_options_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = lmcore.build_model(
        "vocab_size=64,context_length=16,d_model=32,num_layers=1,num_heads=2,pos=nope"
    ).save(tmp_path / "m.safetensors")
    assert (
        main(
            [
                "convert",
                "--from-hf",
                str(tmp_path),
                str(tmp_path / "o.safetensors"),
                "--type",
                "f16",
            ]
        )
        == 2
    )
    assert "--type applies to --to-gguf only" in capsys.readouterr().err
    assert (
        main(["convert", "--to-gguf", str(ckpt), str(tmp_path / "m.gguf"), "--dtype", "float16"])
        == 2
    )
    assert (
        "--dtype and --ignore-field apply to --from-hf and --from-gguf only"
        in capsys.readouterr().err
    )
    assert main(["convert", "--to-gguf", str(ckpt), str(tmp_path / "m.gguf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmcore convert: error: ") and "nope" in err and err.count("\n") == 1
    assert main(["convert", "--from-gguf", str(ckpt), str(tmp_path / "o.safetensors")]) == 2
    assert "is not a GGUF file" in capsys.readouterr().err


def hf_qwen(model_type: str, head_dim: int | None = None) -> Any:
    """A tiny random Qwen 2 (q/k/v biases) or Qwen 3 (q/k norms), norms and biases perturbed."""
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
    return perturbed(transformers.AutoModelForCausalLM.from_config(config).eval())


def write_by_gguf_map(path: Path, model: Any, arch: Any) -> None:
    """`model` in float32 under the tensor names gguf's own map gives (llama.cpp's converter
    uses it), rows as Hugging Face holds them: Qwen's converters do not permute q and k."""
    c = model.config
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    add_shape(w, c)  # rope_theta as hf_qwen sets it
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


@pytest.mark.parametrize(
    ("model_type", "arch", "head_dim", "expect"),
    [
        ("qwen2", "QWEN2", None, "qkv_bias=true"),
        ("qwen3", "QWEN3", None, "qk_norm=rmsnorm(eps=1e-06)"),
        ("qwen3", "QWEN3", 32, "head_dim=32"),  # heads wider than d_model / heads, as Qwen3's
    ],
    ids=["qwen2", "qwen3", "qwen3-wide-heads"],
)
def test_a_gguf_qwen_gives_hugging_faces_logits(
    tmp_path: Path, model_type: str, arch: str, head_dim: int | None, expect: str
) -> None:
    hf = hf_qwen(model_type, head_dim)
    write_by_gguf_map(tmp_path / "m.gguf", hf, gguf.MODEL_ARCH[arch])
    model = load_gguf(tmp_path / "m.gguf")
    assert expect in str(model.spec)
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(model(IDS), expected, atol=1e-4, rtol=0)
        if head_dim is None:  # the file is what transformers' GGUF loader reads, too
            theirs = transformers.AutoModelForCausalLM.from_pretrained(
                tmp_path, gguf_file="m.gguf", dtype=torch.float32
            )
            torch.testing.assert_close(theirs(IDS).logits, expected, atol=1e-4, rtol=0)


def test_a_qwen3_whose_rotary_width_differs_from_its_heads_is_refused(tmp_path: Path) -> None:
    write_by_gguf_map(tmp_path / "m.gguf", hf_qwen("qwen3", 32), gguf.MODEL_ARCH.QWEN3)
    file = read_gguf(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "qwen3")
    for key, field in file.metadata.items():
        if key.startswith("qwen3.") and key != "qwen3.rope.dimension_count":
            w.add_uint32(key, field) if isinstance(field, int) else w.add_float32(key, field)
    w.add_rope_dimension_count(16)
    for name, t in file.tensors_float().items():
        w.add_tensor(name, t.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(
        ConversionError,
        match=r"qwen3\.rope\.dimension_count=16 \(lmcore's heads are qwen3\.attention\.key_length "
        r"= 32 wide",
    ):
        load_gguf(tmp_path / "bad.gguf")
