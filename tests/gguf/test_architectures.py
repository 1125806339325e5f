"""The GGUF architectures lmcore converts (`lmcore.gguf.architectures`): metadata it does not know
or cannot express refused by name (unless ignored), and a Qwen 3 whose rotary width is not its
heads'; what is not a GGUF file at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmcore.errors import ConversionError
from lmcore.gguf import load_gguf, read_gguf
from tests.helpers.errors import raises_naming
from tests.helpers.gguf import (
    hf_llama,
    hf_qwen,
    needs_gguf,
    tiny_gguf,
    write_by_gguf_map,
    write_llama,
)
from tests.helpers.hf import quiet_transformers

gguf = needs_gguf()
transformers = quiet_transformers()


def test_unknown_or_inexpressible_metadata_is_refused_by_name(tmp_path: Path) -> None:
    write_llama(tmp_path / "m.gguf", hf_llama(), extra={"llama.mystery_knob": 3})
    with pytest.raises(ConversionError, match=r"llama\.mystery_knob .*--ignore-field"):
        load_gguf(tmp_path / "m.gguf")
    assert load_gguf(tmp_path / "m.gguf", ignore=["llama.mystery_knob"]).spec.num_layers == 2
    # a `llama` with experts is a Mixtral: its dense FFN tensors are not a Mixtral's
    write_llama(tmp_path / "e.gguf", hf_llama(), extra={"llama.expert_count": 8})
    with raises_naming(ConversionError, "MixtralForCausalLM", "unexpected (6)",
                       "blk.0.ffn_gate.weight", "block_sparse_moe.gate.weight"):  # fmt: skip
        load_gguf(tmp_path / "e.gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ConversionError, match="is not a GGUF file"):
        read_gguf(tmp_path / "x.gguf")


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
    with raises_naming(
        ConversionError,
        "qwen3.rope.dimension_count=16",
        "lmcore's heads are qwen3.attention.key_length = 32 wide",
    ):
        load_gguf(tmp_path / "bad.gguf")


@pytest.mark.parametrize(
    ("name", "edit", "shape", "expected", "keys"),
    [
        ("blk.0.attn_q.weight", lambda x: x[:30], (30, 32), (32, 32),
         ("llama.attention.head_count 4 x head width 8",)),  # P-gguf-shape-a
        ("blk.0.attn_k.weight", lambda x: x[:15], (15, 32), (16, 32),
         ("llama.attention.head_count_kv 2 x head width 8",)),  # P-gguf-shape-b
        ("blk.0.attn_q.weight", lambda x: x.reshape(2, 16, 32), (2, 16, 32), (32, 32),
         ("llama.attention.head_count 4",)),  # P-gguf-shape-c
        ("blk.0.attn_k.weight", lambda x: x.reshape(2, 8, 32), (2, 8, 32), (16, 32),
         ("llama.attention.head_count_kv 2",)),  # P-gguf-shape-d
        ("blk.1.ffn_down.weight", lambda x: x.T, (64, 32), (32, 64),
         ("llama.feed_forward_length",)),
        ("output_norm.weight", lambda x: x[:31], (31,), (32,), ("llama.embedding_length",)),
    ],  # fmt: skip
    ids=["q-rows", "k-rows", "q-3d", "k-3d", "ffn-down-transposed", "norm"],
)
def test_a_tensor_whose_shape_is_not_the_metadata_s_is_refused_by_name(
    tmp_path: Path, name: str, edit: Any, shape: tuple[int, ...], expected: tuple[int, ...],
    keys: tuple[str, ...],
) -> None:  # fmt: skip
    path = tiny_gguf(tmp_path / "m.gguf", tensors={name: edit})
    # the head width is embedding_length / head_count = 32 / 4 = 8, as the file's metadata says
    with raises_naming(ConversionError, str(path), f"tensor {name} has shape {shape}",
                       f"gives it {expected}", "llama.embedding_length", *keys):  # fmt: skip
        load_gguf(path)
