"""Plain helpers and constants the tests import (`from tests.helpers import TINY_SPEC`).

Fixtures live in the conftest.py of the directory that needs them; what is here is imported.
Add to the end of this file, in a section headed with your area.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# ---------------------------------------------------------------------------------------------
# Errors: assert the facts a message exists to carry, not its glue words
# ---------------------------------------------------------------------------------------------


@contextmanager
def raises_naming(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    *facts: str | re.Pattern[str],
) -> Iterator[pytest.ExceptionInfo[BaseException]]:
    """Like `pytest.raises(exc_type)`, and the message names every fact.

    A fact is a plain substring of `str(excinfo.value)` (the offending token, its position, the
    valid choices, the suggestion, the file) or a compiled regex searched in it. A missing fact
    fails the test, naming the fact and the whole message:

        with raises_naming(SpecError, "'rmsnrom'", "position 7", "did you mean 'rmsnorm'"):
            parse_spec("norm=rmsnrom")
    """
    for fact in facts:
        if not isinstance(fact, (str, re.Pattern)):
            raise TypeError(f"a fact is a str or a compiled regex, not {type(fact).__name__}")
    with pytest.raises(exc_type) as excinfo:
        yield excinfo
    message = str(excinfo.value)
    missing = [
        fact
        for fact in facts
        if (fact.search(message) is None if isinstance(fact, re.Pattern) else fact not in message)
    ]
    if missing:
        shown = ", ".join(repr(fact) for fact in missing)
        raise AssertionError(
            f"{type(excinfo.value).__name__} does not name {shown}; its message:\n{message}"
        )


# ---------------------------------------------------------------------------------------------
# Training: a tiny model and a tiny corpus
# ---------------------------------------------------------------------------------------------

TINY_SPEC = "vocab_size=300, context_length=16, d_model=32, num_layers=2, num_heads=2"


def tiny_corpus(root: Path) -> Path:
    """A small text with structure a tiny model learns in a few hundred steps: a few "functions"
    repeated with small variations, one per document."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(24):
        lines = [
            f"def f{(i + k) % 5}(x):\n    return x * {k % 3} + {(i * k) % 4}\n" for k in range(12)
        ]
        (root / f"doc{i:02d}.py").write_text("".join(lines), encoding="utf-8")
    return root


# ---------------------------------------------------------------------------------------------
# Models and checkpoints: small specs, perturbed weights, files edited on disk
# ---------------------------------------------------------------------------------------------
# (imports here, not at the top: each area appends its own section)

import json  # noqa: E402
import struct  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import lmcore  # noqa: E402

# A small model: two layers, four heads of 8 dimensions (room for num_kv_heads=2 or 1).
SMALL_SPEC = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"
# The same with room for a prompt and the tokens generated after it.
DECODING_SPEC = "vocab_size=97, context_length=24, d_model=32, num_layers=2, num_heads=4, d_ff=64"


def decoding_model(spec: str = "", seed: int = 0, registry: Any = None) -> Any:
    """A model of `DECODING_SPEC` with `spec` added ("pos=alibi, num_kv_heads=2"), seeded."""
    torch.manual_seed(seed)
    return lmcore.build_model(
        f"{DECODING_SPEC}, {spec}" if spec else DECODING_SPEC, registry=registry
    )


def perturb(model: torch.nn.Module, scale: float = 0.1) -> Any:
    """`model` with every parameter moved by `scale` times a standard normal (norm gains and
    biases too), so a weight that is not saved, loaded or converted changes the logits."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def perturbed(spec: str, seed: int = 0, **kwargs: Any) -> Any:
    """`lmcore.build_model(spec, **kwargs)`, seeded and perturbed."""
    torch.manual_seed(seed)
    return perturb(lmcore.build_model(spec, **kwargs))


def token_ids(vocab: int = 97, seq: int = 16, seed: int = 1) -> torch.Tensor:
    """Two rows of `seq` token ids, the same at every call."""
    return torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(seed))


def rewrite(
    path: Path,
    *,
    metadata: Callable[[dict[str, str]], dict[str, str]] | None = None,
    tensors: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
    out: Path | None = None,
) -> Path:
    """Save a copy of a safetensors file (over it unless `out`) with its metadata and/or its
    tensors changed; changed tensors get checksums of their own, so the file is consistent in
    itself and the checks after the integrity check see the change."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from lmcore.model.saving import checksums_json

    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    state = load_file(str(path))
    meta = metadata(meta) if metadata else meta
    if tensors:
        state = tensors(state)
        if "lmcore.checksums" in meta:
            meta["lmcore.checksums"] = checksums_json(state)
    out = out or path
    save_file(state, str(out), metadata=meta)
    return out


def edit(
    path: Path,
    out: Path,
    *,
    header: Callable[[dict[str, Any]], None] | None = None,
    data: Callable[[dict[str, Any], bytearray], None] | None = None,
) -> Path:
    """A copy of a safetensors file with its JSON header and/or its data bytes changed in
    place, the way a damaged disk or a hand edit changes them (checksums untouched)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    parsed, body = json.loads(raw[8 : 8 + n]), bytearray(raw[8 + n :])
    if header:
        header(parsed)
    if data:
        data(parsed, body)
    text = json.dumps(parsed).encode()
    text += b" " * (-len(text) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + bytes(body))
    return out


# The components and a norm of the tests' own, for the declarations of every component


def components() -> list[tuple[str, str]]:
    """Every registered component, so newly installed plugins are tested without editing this."""
    return sorted({(e.kind, e.name) for e in lmcore.get_registry().entries()})


def spec_for(kind: str, name: str) -> str:
    """cs336-tiny with the component `kind` `name`; skips one that has no default to build."""
    entry = next(e for e in lmcore.get_registry().entries(kind) if e.name == name)
    required = [a.name for a in entry.component.args if a.required]
    if required:
        pytest.skip(f"{kind} {name!r} needs argument(s) {', '.join(required)}: no default to build")
    qualified = f"{entry.provenance.qualifier}:{name}" if entry.status == "shadowed" else name
    return f"cs336-tiny, {kind}={qualified}"


class PlainNorm(torch.nn.Module):
    """An RMS norm in float32 for the tests' own components."""

    def __init__(
        self, d_model: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight).to(
            x.dtype
        )


@contextmanager
def warns_naming(
    warning_type: type[Warning], *facts: str | re.Pattern[str]
) -> Iterator[pytest.WarningsRecorder]:
    """`raises_naming` for a warning: like `pytest.warns(warning_type)`, and one of the warnings
    of that type names every fact (a plain substring or a compiled regex)."""
    with pytest.warns(warning_type) as record:
        yield record
    messages = [str(w.message) for w in record if issubclass(w.category, warning_type)]

    def names(message: str, fact: str | re.Pattern[str]) -> bool:
        return fact.search(message) is not None if isinstance(fact, re.Pattern) else fact in message

    if not any(all(names(m, f) for f in facts) for m in messages):
        shown = "\n".join(messages)
        raise AssertionError(
            f"no {warning_type.__name__} names all of {facts!r}; they say:\n{shown}"
        )


def non_finite_checkpoint(directory: Path) -> Path:
    """A checkpoint of `SMALL_SPEC` whose ln_final holds a NaN and lm_head two infs, saved so
    (its checksums agree): loading it warns, naming them."""
    model = lmcore.build_model(SMALL_SPEC)
    with torch.no_grad():
        model.ln_final.weight[3] = float("nan")
        model.lm_head.weight[0, :2] = float("inf")
    path: Path = model.save(directory / "nan.safetensors")
    return path


def nest_components(parsed: dict[str, Any]) -> None:
    """For `edit`'s header: a components table nested 50,000 deep, more than Python's JSON
    parser follows."""
    parsed["__metadata__"]["lmcore.components"] = "[" * 50_000 + "]" * 50_000


# ---------------------------------------------------------------------------------------------
# Hugging Face interop: tiny random transformers models, saved as model directories
# ---------------------------------------------------------------------------------------------


def quiet_transformers() -> Any:
    """transformers (a test-only dependency; a module that calls this at import is skipped
    without it), its logging and progress bars silenced."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


# The lmcore spec of `random_llama`'s model, and the logits both must give (float32).
HF_SPEC = "vocab_size=97, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=48"
HF_TOLERANCE = 1e-5  # max abs logit difference

LLAMA_V4 = {  # a transformers 4 config.json
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1,
    "eos_token_id": 2, "pretraining_tp": 1, "transformers_version": "4.45.0",
}  # fmt: skip


def random_llama(
    directory: Path, *, kv_heads: int = 2, tie: bool = False, shard: bool = False, **config: Any
) -> Any:
    """A small random Llama, every weight perturbed (RMSNorm gains too), saved to `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=tie, **config,
    )  # fmt: skip
    model = perturb(LlamaForCausalLM(cfg).eval())
    model.save_pretrained(directory, max_shard_size="20KB" if shard else "5GB")
    return model


def hf_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids).logits
    return logits


def lm_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(ids)
    return logits


# One tiny config per family lmcore converts, each using what sets the family apart.
HF_VOCAB = 97
_SIZES: dict[str, Any] = dict(
    vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}  # fmt: skip
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(_SIZES, rope_scaling=_LLAMA3, rope_theta=500.0),
    "mistral": dict(_SIZES, sliding_window=6),
    "qwen2": dict(_SIZES, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    "qwen3": dict(_SIZES, head_dim=16, tie_word_embeddings=True),
    "gemma": dict(_SIZES, head_dim=8),
    "gemma2": dict(_SIZES, head_dim=8, sliding_window=6, query_pre_attn_scalar=8,
                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
    "olmo2": dict(_SIZES),
    "phi3": dict(_SIZES, partial_rotary_factor=0.5, pad_token_id=0),
    "gpt2": dict(vocab_size=HF_VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                 scale_attn_by_inverse_layer_idx=True),
    "gpt_neox": dict(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
                     rotary_pct=0.5),
    "mixtral": dict(_SIZES, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(_SIZES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                      head_dim=8, norm_topk_prob=True, mlp_only_layers=[1]),
}  # fmt: skip


def random_family_model(name: str, directory: Path) -> Any:
    """A tiny random model of family `name` (`FAMILY_CONFIGS`), eager attention, every weight
    perturbed (norm gains and biases too, so they matter), saved to `directory`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **FAMILY_CONFIGS[name])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    perturb(model)
    model.save_pretrained(directory)
    return model


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
