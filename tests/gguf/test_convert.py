"""GGUF files to lmcore models and checkpoints (`lmcore.gguf.convert`), on tiny files the tests
write themselves with gguf's writer, the way llama.cpp's converter writes them (q/k rows
permuted): a Llama in every quantization gives the logits of transformers' Llama with the very
weights the file holds (each tensor quantized and dequantized by `gguf.quants`, in Hugging
Face's row order); Qwen 2 and 3, written by gguf's own tensor map, give Hugging Face's logits.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import lmcore
from lmcore.gguf import convert_from_gguf, load_gguf
from lmcore.model.generate import GREEDY
from tests.helpers.gguf import (
    GGUF_IDS,
    hf_llama,
    hf_qwen,
    needs_gguf,
    reference_logits,
    tiny_gguf,
    write_by_gguf_map,
    write_llama,
)
from tests.helpers.memory import assert_only_the_context_differs, conversion_growth
from tests.helpers.hf import quiet_transformers

gguf = needs_gguf()
transformers = quiet_transformers()
T = gguf.GGMLQuantizationType


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
        ours = model(GGUF_IDS)
    torch.testing.assert_close(ours, reference_logits(hf, held, GGUF_IDS), atol=1e-4, rtol=0)


def test_a_gguf_without_output_weight_is_tied(tmp_path: Path) -> None:
    hf = hf_llama(tied=True)
    held = write_llama(tmp_path / "m.gguf", hf, T.Q8_0)
    model = load_gguf(tmp_path / "m.gguf")
    assert model.spec.tie_embeddings
    assert model.lm_head.weight is model.token_embeddings.weight
    with torch.no_grad():
        torch.testing.assert_close(
            model(GGUF_IDS), reference_logits(hf, held, GGUF_IDS), atol=1e-4, rtol=0
        )


def test_convert_from_gguf_writes_a_checkpoint_lmcore_loads(tmp_path: Path) -> None:
    hf = hf_llama()
    held = write_llama(tmp_path / "m.gguf", hf, T.F16)
    out = convert_from_gguf(tmp_path / "m.gguf", tmp_path / "m.safetensors")
    assert lmcore.read_info(out).dtype == "float16"
    model = lmcore.load(out, dtype=torch.float32)
    # the F32 norm gains are stored float16 with the rest: 1e-3, not 1e-4
    with torch.no_grad():
        torch.testing.assert_close(
            model(GGUF_IDS), reference_logits(hf, held, GGUF_IDS), atol=1e-3, rtol=0
        )


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
        expected = hf(GGUF_IDS).logits
        torch.testing.assert_close(model(GGUF_IDS), expected, atol=1e-4, rtol=0)
        if head_dim is None:  # the file is what transformers' GGUF loader reads, too
            theirs = transformers.AutoModelForCausalLM.from_pretrained(
                tmp_path, gguf_file="m.gguf", dtype=torch.float32
            )
            torch.testing.assert_close(theirs(GGUF_IDS).logits, expected, atol=1e-4, rtol=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_long_context_converts_in_the_memory_of_a_short_one(tmp_path: Path) -> None:
    """P-gguf-ctx: llama.context_length = 10**7 (issue 32: 10**8 took 5.3 GB for a 160 KB
    model): RoPE's tables are never saved, so they are never computed; the checkpoint holds
    the very tensors of the short file's, and only its spec's context_length differs."""
    context = 10**7
    short, long = tiny_gguf(tmp_path / "short.gguf"), tmp_path / "long.gguf"
    tiny_gguf(long, {"llama.context_length": context})
    grown = conversion_growth("lmcore.gguf:convert_from_gguf", short, long)
    # the cos and sin tables: context x (head_dim 8 / 2) float32 each, 305 MiB together
    tables = 2 * context * (8 // 2) * 4
    assert grown < tables / 8, (grown, tables)
    assert_only_the_context_differs(short, long, (64, context))


def test_a_converted_checkpoint_generates_as_the_gguf_model(tmp_path: Path) -> None:
    """The conversion builds no buffers (`build_empty(buffers=False)`); loading the checkpoint
    builds them, and it generates what `load_gguf`'s model (buffers built) does."""
    path = tiny_gguf(tmp_path / "m.gguf")
    model = lmcore.load(convert_from_gguf(path, tmp_path / "m.safetensors"))
    direct = load_gguf(path)
    assert model.state_dict().keys() == direct.state_dict().keys()
    prompt = torch.tensor([[1, 2, 3]])
    new = model.generate(prompt, 5, GREEDY)
    assert new.shape == (1, 5)
    assert torch.equal(new, direct.generate(prompt, 5, GREEDY))
