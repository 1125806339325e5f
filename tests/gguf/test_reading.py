"""Reading a GGUF file (`lmcore.gguf.reading`): every count and length in its header, metadata
and tensor descriptions is checked against the bytes left in the file before the gguf package
allocates what they size (issue 32: a string array claiming 2**62 items looped for minutes and
took gigabytes)."""

from __future__ import annotations

import resource
import struct
import time
from pathlib import Path

import pytest

from lmcore.errors import ConversionError
from lmcore.gguf import read_gguf
from tests.helpers.errors import raises_naming
from tests.helpers.gguf import huge_array, needs_gguf, tiny_gguf

gguf = needs_gguf()


def test_an_array_claiming_more_items_than_the_file_holds_is_refused_at_once(
    tmp_path: Path,
) -> None:  # P-gguf-array
    path = huge_array(tmp_path / "m.gguf", zeros=8 * 2**20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    # 2**62 strings take at least 8 bytes each (their length): 2**65 bytes
    with raises_naming(ConversionError, "general.tags", f"{2**62:,} string items",
                       f"{2**65:,} bytes", f"{8 * 2**20:,} left", "fetch it again"):  # fmt: skip
        read_gguf(path)
    assert time.perf_counter() - start < 1.0
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50_000  # the 8 MiB of zeros are not read into memory, let alone parsed


def test_an_array_the_file_does_hold_is_read(tmp_path: Path) -> None:
    # the same array, claiming the items that are there: 2**10 empty strings
    path = huge_array(tmp_path / "m.gguf", items=2**10, zeros=8 * 2**10)
    assert read_gguf(path).metadata["general.tags"] == [""] * 2**10


def _header(kv: bytes, keys: int = 1, tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, keys) + kv


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


@pytest.mark.parametrize(
    ("raw", "facts"),
    [
        (_header(struct.pack("<Q", 2**40) + b"x" * 64), ("metadata key 0", f"{2**40:,} bytes")),
        (_header(b"", keys=2**50), (f"{2**50:,} metadata keys",)),
        (_header(_s(b"general.name") + struct.pack("<I", 8) + struct.pack("<Q", 2**33)),
         ("the string value of general.name", f"{2**33:,} bytes")),  # fmt: skip
        (_header(_s(b"general.x") + struct.pack("<I", 77) + b"\0" * 16),
         ("general.x", "value type 77")),  # fmt: skip
        (_header(b"", keys=0, tensors=2**40), (f"{2**40:,} tensor descriptions",)),
        (_header(_s(b"t") + struct.pack("<I", 9) + b"\0" * 64, keys=0, tensors=1),
         ("tensor t", "9 dimensions", "at most 4")),  # fmt: skip
    ],
    ids=["key-length", "key-count", "string-length", "value-type", "tensor-count", "dims"],
)
def test_every_length_in_the_header_is_checked_against_the_file(
    tmp_path: Path, raw: bytes, facts: tuple[str, ...]
) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(raw)
    with raises_naming(ConversionError, str(path), *facts):
        read_gguf(path)


def test_a_well_formed_file_passes_the_walk_unchanged(tmp_path: Path) -> None:
    file = read_gguf(tiny_gguf(tmp_path / "m.gguf"))
    assert file.metadata["llama.block_count"] == 2
    assert file.tensors["blk.1.attn_k.weight"].shape == (16, 32)


def _package_value(field: object) -> object:
    """A metadata value as the gguf package's reader gives it (a float32 as its shortest
    decimal, as lmcore keeps it)."""
    import numpy as np

    value = field.contents()  # type: ignore[attr-defined]
    if len(field.types) == 1 and field.types[0].name == "FLOAT32":  # type: ignore[attr-defined]
        return float(str(np.float32(value)))
    return value.item() if isinstance(value, np.generic) else value


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_every_value_and_tensor_is_what_the_gguf_package_reads(tmp_path: Path, endian: str) -> None:
    import numpy as np

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian[endian])
    w.add_string("general.name", "tëst")
    w.add_uint32("llama.block_count", 3)
    w.add_uint64("llama.big", 2**40 + 3)
    w.add_int32("llama.neg", -7)
    w.add_float32("llama.eps", 1e-5)
    w.add_float64("llama.theta", 1e6 + 0.25)
    w.add_bool("llama.flag", True)
    w.add_array("tokenizer.ggml.tokens", ["a", "", "ü", "<s>"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.25, 3.0])
    w.add_array("tokenizer.ggml.token_type", [1, 2, 3, 1])
    gen = np.random.default_rng(0)
    floats = gen.standard_normal((6, 64)).astype(np.float32)
    w.add_tensor("f32", floats)
    w.add_tensor("f16", floats.astype(np.float16))
    quantized = ("Q8_0", "Q4_0", "Q4_1", "Q5_0") if endian == "LITTLE" else ()
    for name in quantized:  # the blocks' bytes, as llama-quantize writes them
        qtype = gguf.GGMLQuantizationType[name]
        w.add_tensor(name, gguf.quants.quantize(floats, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours, theirs = read_gguf(path), gguf.GGUFReader(str(path))
    want = {k: _package_value(f) for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert dict(ours.metadata) == want and ours.metadata["llama.eps"] == 1e-05
    assert ours.order == (">" if endian == "BIG" else "<")
    assert list(ours.tensors) == [t.name for t in theirs.tensors] == ["f32", "f16", *quantized]
    for t in theirs.tensors:
        entry = ours.tensors[t.name]
        assert (entry.type, entry.nbytes) == (t.tensor_type.name, int(t.n_bytes))
        assert entry.shape == tuple(int(n) for n in reversed(list(t.shape)))
        raw = ours.raw(t.name)
        assert raw.flags.writeable and not np.shares_memory(raw, np.asarray(t.data))
        expect = np.asarray(t.data)
        if endian == "BIG":  # the package leaves big-endian elements as the file holds them
            expect = expect.astype(expect.dtype.newbyteorder("="))
        np.testing.assert_array_equal(raw, expect)
        deq = gguf.quants.dequantize(expect, t.tensor_type).astype(np.float32)
        np.testing.assert_array_equal(ours.tensor(t.name).numpy(), deq.reshape(entry.shape))
    np.testing.assert_array_equal(ours.tensor("f32").numpy(), floats)
