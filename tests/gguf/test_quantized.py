"""GGUF's quantized matrices kept quantized (`lmcore.gguf.quantized`): a model in Q4_0, Q4_1
or Q8_0 written, read back with its blocks kept and written again gives the same bytes, and
computes what the dequantized file computes; what cannot be kept is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import lmcore
from lmcore.errors import ConversionError
from lmcore.gguf import load_gguf, save_gguf
from lmcore.quantizing import quantize_model
from tests.helpers.gguf import needs_gguf

gguf = needs_gguf()

SPEC = "cs336-tiny, num_kv_heads=2"  # q and k rows permuted on the way, k fewer heads


def _tensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, np.asarray(t.data).copy()) for t in reader.tensors}


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1(embedding=q8_0)", "q8_0"])
def test_round_trip_is_byte_identical(tmp_path: Path, fmt: str) -> None:
    torch.manual_seed(0)
    model = quantize_model(lmcore.build_model(SPEC), fmt)
    first = save_gguf(model, tmp_path / "a.gguf")
    written = _tensors(first)
    kinds = {name: kind for name, (kind, _) in written.items() if name.endswith("weight")}
    main = fmt[:4].upper()
    assert kinds["blk.0.attn_q.weight"] == main and kinds["blk.0.ffn_down.weight"] == main
    assert kinds["token_embd.weight"] == ("Q8_0" if "q8_0" in fmt else main)
    assert kinds["blk.0.attn_norm.weight"] == "F32"
    kept = load_gguf(first, keep_quantized=True)
    assert kept.spec == model.spec
    for (a, x), (b, y) in zip(model.state_dict().items(), kept.state_dict().items(), strict=True):
        assert a == b and torch.equal(x, y), a
    again = _tensors(save_gguf(kept, tmp_path / "b.gguf"))
    assert written.keys() == again.keys()
    for name, (kind, data) in written.items():
        assert again[name][0] == kind and np.array_equal(again[name][1], data), name
    plain = load_gguf(first)  # the gguf package's dequantize of the same file
    ids = torch.randint(0, 10000, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.enable_grad():  # x needing gradients: the exact float32 path of the blocks
        torch.testing.assert_close(kept(ids), plain(ids), rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # torch's kernels: bfloat16 activations and scales
        want = plain(ids)
        assert (kept(ids) - want).abs().max() <= 3e-2 * want.abs().max()


def test_int8_needs_a_type_and_then_rounds_per_32(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = quantize_model(lmcore.build_model(SPEC), "int8")
    with pytest.raises(ConversionError, match=r"stored int8, which has no GGUF type; pass "
                       r"--type \(bf16, f16, f32, q8_0\): q8_0 rounds it again per 32"):  # fmt: skip
        save_gguf(model, tmp_path / "m.gguf")
    path = save_gguf(model, tmp_path / "m.gguf", type="q8_0")
    assert _tensors(path)["blk.0.attn_q.weight"][0] == "Q8_0"


def test_what_cannot_be_kept_is_refused_by_name(tmp_path: Path) -> None:
    path = save_gguf(lmcore.build_model(SPEC), tmp_path / "f.gguf")  # F32 matrices
    with pytest.raises(ConversionError, match=r"tensor token_embd.weight is F32, which lmcore "
                       r"cannot keep quantized .*convert without --keep-quantized"):  # fmt: skip
        load_gguf(path, keep_quantized=True)
    with pytest.raises(ConversionError, match="keeps the file's blocks; it takes no dtype"):
        load_gguf(path, keep_quantized=True, dtype=torch.float16)
