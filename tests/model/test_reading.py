"""The checkpoint file at the byte level (`lmcore.model.reading`): what is not a safetensors file,
a truncated or corrupted header, and the CRC-32 of every tensor verified on load; metadata too
deeply nested to parse. Each damaged file is one the hostile probe loaded silently, rebuilt here
byte for byte."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore import CheckpointError
from lmcore.checkpoint import read_header, read_info
from tests.helpers.errors import raises_naming
from tests.helpers.models import edit, nest_components


def start_of(name: str) -> Callable[[dict], int]:
    return lambda parsed: parsed[name]["data_offsets"][0]


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"nothere.safetensors: no such file"):
        lmcore.load(tmp_path / "nothere.safetensors")


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.safetensors"
    text.write_text("these are my notes, not weights\n")
    with raises_naming(
        CheckpointError,
        "notes.safetensors: ",
        "not a safetensors file",
        "does not start with a safetensors header",
        "written by lmcore.save",
    ):
        lmcore.load(text)
    pt = tmp_path / "weights.safetensors"
    torch.save({"w": torch.zeros(2)}, pt)
    with raises_naming(
        CheckpointError,
        "not a safetensors file",
        "a zip archive, which is what torch.save writes",
        "lmcore.load_state_dict_file(path, spec)",
    ):
        lmcore.load(pt)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match=r"\(it is only 2 bytes long\)"):
        lmcore.load(tiny)
    with raises_naming(
        CheckpointError,
        "neither a model file",
        "a checkpoint directory (holding model.safetensors)",
        "a run directory (holding run.json)",
    ):
        lmcore.load(tmp_path)


def test_a_truncated_file(saved: Path) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with raises_naming(
        CheckpointError,
        "m.safetensors: is truncated",
        re.compile(r"its header describes [\d,]+ bytes of tensor data"),
        re.compile(r"the file holds [\d,]+;"),
        "an interrupted copy or download?",
        "copy it again",
    ):
        lmcore.load(saved)
    saved.write_bytes(data[:100])  # cut inside the header
    with raises_naming(
        CheckpointError,
        "is truncated",
        re.compile(r"its safetensors header needs [\d,]+ bytes after the first 8"),
        "only 100 bytes in all",
    ):
        read_info(saved)


def test_a_corrupted_header(saved: Path) -> None:
    data = bytearray(saved.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + length]
    colon = header.index(b":")
    data[8 + colon] = ord("#")  # one flipped byte inside the JSON
    saved.write_bytes(bytes(data))
    with raises_naming(
        CheckpointError,
        "m.safetensors: ",
        "corrupted safetensors header",
        "not valid JSON (",
        "restore it from a good copy",
    ):
        lmcore.load(saved)


def test_a_header_whose_offsets_disagree_with_the_shapes(saved: Path) -> None:
    data = saved.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["ln_final.weight"]["shape"] = [16]  # 32 floats of data, 16 declared
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    saved.write_bytes(data[:8] + raw + data[8 + length :])
    with raises_naming(
        CheckpointError,
        "corrupted safetensors header",
        "tensor 'ln_final.weight' (F32, shape (16,))",
        "should take 64 bytes",
        "its offsets give 128",
    ):
        read_header(saved)


# ------------------------------------------------------------------ integrity


def test_flipped_bytes_are_refused_naming_the_tensor(saved: Path, tmp_path: Path) -> None:
    def flip(parsed: dict, body: bytearray) -> None:
        body[start_of("lm_head.weight")(parsed) + 100] ^= 0xFF

    bad = edit(saved, tmp_path / "flip.safetensors", data=flip)
    with raises_naming(
        CheckpointError,
        f"{bad}: fails its integrity check",
        "the bytes of lm_head.weight do not match their crc32",
        "restore it from a good copy",
        "lmcore.load(..., verify=False)",
    ):
        lmcore.load(bad)
    unchecked = lmcore.load(bad, verify=False)  # as asked: loaded, the damage and all
    assert not torch.equal(unchecked.lm_head.weight, lmcore.load(saved).lm_head.weight)


def test_a_nan_written_into_the_data_is_refused(saved: Path, tmp_path: Path) -> None:
    def nan(parsed: dict, body: bytearray) -> None:
        at = start_of("ln_final.weight")(parsed)
        body[at : at + 4] = struct.pack("<f", float("nan"))

    bad = edit(saved, tmp_path / "nan.safetensors", data=nan)
    with pytest.raises(CheckpointError, match=r"the bytes of ln_final.weight do not match"):
        lmcore.load(bad)


def test_swapped_offsets_of_two_same_shape_tensors_are_refused(saved: Path, tmp_path: Path) -> None:
    def swap(parsed: dict) -> None:
        q, k = parsed["layers.0.attn.q_proj.weight"], parsed["layers.0.attn.k_proj.weight"]
        q["data_offsets"], k["data_offsets"] = k["data_offsets"], q["data_offsets"]

    bad = edit(saved, tmp_path / "swap.safetensors", header=swap)
    with raises_naming(
        CheckpointError,
        "fails its integrity check",
        "the bytes of layers.0.attn.k_proj.weight, layers.0.attn.q_proj.weight do not match",
    ):
        lmcore.load(bad)


def test_a_checksum_table_that_does_not_fit_the_tensors(saved: Path, tmp_path: Path) -> None:
    def drop(parsed: dict) -> None:
        table = json.loads(parsed["__metadata__"]["lmcore.checksums"])
        table["tensors"]["ghost.weight"] = table["tensors"].pop("ln_final.weight")
        parsed["__metadata__"]["lmcore.checksums"] = json.dumps(table)

    bad = edit(saved, tmp_path / "t.safetensors", header=drop)
    with raises_naming(
        CheckpointError,
        "fails its integrity check",
        "checksums of tensors it does not hold: ghost.weight",
        "no checksum for ln_final.weight",
    ):
        lmcore.load(bad)

    def garble(parsed: dict) -> None:
        parsed["__metadata__"]["lmcore.checksums"] = '{"algorithm": "md5", "tensors": {}}'

    with raises_naming(
        CheckpointError,
        "damaged lmcore metadata",
        "lmcore.checksums cannot be read (TypeError: not a crc32 table of strings)",
    ):
        read_info(edit(saved, tmp_path / "g.safetensors", header=garble))


def test_a_file_saved_without_checksums_loads_with_nothing_to_verify(
    saved: Path, tmp_path: Path
) -> None:
    def older(parsed: dict) -> None:
        del parsed["__metadata__"]["lmcore.checksums"]  # as lmcore wrote them before

    old = edit(saved, tmp_path / "old.safetensors", header=older)
    assert read_info(old).checksums is None
    model = lmcore.load(old)
    assert torch.equal(model.lm_head.weight, lmcore.load(saved).lm_head.weight)


def test_metadata_nested_too_deep_is_one_line(saved: Path, tmp_path: Path) -> None:
    # The probe: a components JSON nested 50,000 deep gave RecursionError tracebacks in load,
    # describe and run (the commands: tests/cli/test_describe_damaged_checkpoint.py).
    bad = edit(saved, tmp_path / "deep.safetensors", header=nest_components)
    with raises_naming(
        CheckpointError,
        f"{bad}: has damaged lmcore metadata",
        "lmcore.components cannot be read",
        "(JSONDecodeError: nested deeper than Python's parser follows: line 1 column 1 (char 0))",
        "edited or damaged after lmcore saved it",
    ) as caught:
        lmcore.load(bad)
    assert "\n" not in str(caught.value)


def test_a_file_removed_while_its_tensors_are_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe: `eval RUN` while RUN pruned its checkpoints escaped with torch's
    # "RuntimeError: unable to mmap ...: No such file or directory (2)" (safetensors opens the
    # file again through torch), naming no file as an OSError would.
    import lmcore.model.reading as reading

    path = tmp_path / "m.safetensors"
    lmcore.save(lmcore.build_model("cs336-tiny"), path)

    def pruned(name: str, device: str) -> None:
        Path(name).unlink()
        raise RuntimeError(f"unable to mmap 1024 bytes from file <{name}>: No such file or directory (2)")

    monkeypatch.setattr(reading, "load_file", pruned)
    with pytest.raises(FileNotFoundError, match="removed while its tensors were read") as e:
        reading.read_tensors(path, torch.device("cpu"))
    assert e.value.filename == str(path)  # what `lmcore.runfiles.with_checkpoint` and main see

    lmcore.save(lmcore.build_model("cs336-tiny"), path)

    def out_of_memory(name: str, device: str) -> None:  # the file is there: not about it
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(reading, "load_file", out_of_memory)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        reading.read_tensors(path, torch.device("cpu"))
