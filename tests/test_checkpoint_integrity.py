"""Checkpoint integrity: the CRC-32 of every tensor saved with it and verified on load, ties the
stored tensors must agree with, dtypes never changed silently, non-finite weights reported, and
metadata too deeply nested to parse. Each damaged file is one the hostile probe loaded
silently, rebuilt here byte for byte."""

from __future__ import annotations

import json
import re
import struct
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import lmcore
from lmcore import CheckpointError
from lmcore.checkpoint import load_weights, read_header, read_info, verify_checksums
from lmcore.cli.main import main
from lmcore.errors import NonFiniteWeightsWarning
from lmcore.model.saving import checksums_json

SPEC = "vocab_size=97, context_length=16, d_model=32, num_layers=1, num_heads=2, d_ff=64"


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return lmcore.build_model(SPEC).save(tmp_path / "m.safetensors")


def edit(path: Path, out: Path, *, header: Callable[[dict], None] | None = None,
         data: Callable[[dict, bytearray], None] | None = None) -> Path:  # fmt: skip
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


def start_of(name: str) -> Callable[[dict], int]:
    return lambda parsed: parsed[name]["data_offsets"][0]


def test_each_tensors_crc32_is_stored_in_the_metadata(saved: Path) -> None:
    raw = saved.read_bytes()
    header = read_header(saved)
    table = json.loads(header.metadata["lmcore.checksums"])
    assert table["algorithm"] == "crc32"
    for name, t in header.tensors.items():  # the CRC of the very bytes in the file
        chunk = raw[header.data_start + t.offsets[0] : header.data_start + t.offsets[1]]
        assert table["tensors"][name] == f"{zlib.crc32(chunk):08x}"
    assert sorted(table["tensors"]) == sorted(header.tensors)
    verify_checksums(read_info(saved))


def test_flipped_bytes_are_refused_naming_the_tensor(saved: Path, tmp_path: Path) -> None:
    def flip(parsed: dict, body: bytearray) -> None:
        body[start_of("lm_head.weight")(parsed) + 100] ^= 0xFF

    bad = edit(saved, tmp_path / "flip.safetensors", data=flip)
    with pytest.raises(CheckpointError, match=re.escape(
        f"{bad}: fails its integrity check: the bytes of lm_head.weight do not match their "
        "crc32. The file was damaged or changed after lmcore saved it (a bad disk or copy?): "
        "restore it from a good copy (lmcore.load(..., verify=False) loads it unchecked)"
    )):  # fmt: skip
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
    with pytest.raises(CheckpointError, match=re.escape(
        "fails its integrity check: the bytes of layers.0.attn.k_proj.weight, "
        "layers.0.attn.q_proj.weight do not match their crc32"
    )):  # fmt: skip
        lmcore.load(bad)


def test_a_checksum_table_that_does_not_fit_the_tensors(saved: Path, tmp_path: Path) -> None:
    def drop(parsed: dict) -> None:
        table = json.loads(parsed["__metadata__"]["lmcore.checksums"])
        table["tensors"]["ghost.weight"] = table["tensors"].pop("ln_final.weight")
        parsed["__metadata__"]["lmcore.checksums"] = json.dumps(table)

    bad = edit(saved, tmp_path / "t.safetensors", header=drop)
    with pytest.raises(CheckpointError, match=re.escape(
        "fails its integrity check: checksums of tensors it does not hold: ghost.weight; no "
        "checksum for ln_final.weight."
    )):  # fmt: skip
        lmcore.load(bad)

    def garble(parsed: dict) -> None:
        parsed["__metadata__"]["lmcore.checksums"] = '{"algorithm": "md5", "tensors": {}}'

    with pytest.raises(CheckpointError, match=re.escape(
        "has damaged lmcore metadata: lmcore.checksums cannot be read (TypeError: not a crc32 "
        "table of strings)"
    )):  # fmt: skip
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


def test_a_tie_in_the_metadata_never_drops_a_stored_tensor(saved: Path, tmp_path: Path) -> None:
    # The probe: adding lmcore.tied {"lm_head.weight": "token_embeddings.weight"} to an untied
    # model's metadata made lmcore.load throw the stored lm_head.weight away, silently.
    def tie(parsed: dict) -> None:
        parsed["__metadata__"]["lmcore.tied"] = json.dumps(
            {"lm_head.weight": "token_embeddings.weight"}
        )

    bad = edit(saved, tmp_path / "tie.safetensors", header=tie)
    with pytest.raises(CheckpointError, match=re.escape(
        f"{bad}: its metadata ties lm_head.weight to token_embeddings.weight (lmcore.tied), but "
        "the file stores a different lm_head.weight; the metadata was edited after lmcore "
        "saved it: remove 'lm_head.weight' from lmcore.tied, or restore the file"
    )):  # fmt: skip
        lmcore.load(bad)

    def tie_and_drop(parsed: dict, body: bytearray) -> None:  # no lm_head stored at all
        tie(parsed)
        start, end = parsed.pop("lm_head.weight")["data_offsets"]
        del body[start:end]
        for entry in parsed.values():
            if (
                isinstance(entry, dict)
                and "data_offsets" in entry
                and entry["data_offsets"][0] >= end
            ):
                entry["data_offsets"] = [o - (end - start) for o in entry["data_offsets"]]
        table = json.loads(parsed["__metadata__"]["lmcore.checksums"])
        del table["tensors"]["lm_head.weight"]
        parsed["__metadata__"]["lmcore.checksums"] = json.dumps(table)

    dropped = edit(saved, tmp_path / "dropped.safetensors", data=tie_and_drop)
    with pytest.raises(CheckpointError, match=re.escape(
        "ties lm_head.weight to token_embeddings.weight (lmcore.tied) and the file does not "
        "store lm_head.weight, but the model its spec builds keeps the two apart"
    )):  # fmt: skip
        lmcore.load(dropped)
    tied = lmcore.build_model(f"{SPEC}, tie_embeddings=true").save(tmp_path / "tied.safetensors")
    model = lmcore.load(tied)  # a true tie: one tensor stored, two names
    assert model.lm_head.weight is model.token_embeddings.weight


def resave(path: Path, out: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy with tensors replaced and checksums to match: a file consistent in itself."""
    state, meta = load_file(str(path)), dict(read_header(path).metadata)
    change(state)
    meta["lmcore.checksums"] = checksums_json(state)
    save_file(state, str(out), metadata=meta)
    return out


def test_integer_tensors_are_refused_unless_a_dtype_is_asked_for(
    saved: Path, tmp_path: Path
) -> None:
    # The probe: int32 tensors were cast to float silently.
    def ints(state: dict[str, torch.Tensor]) -> None:
        state["ln_final.weight"] = torch.full((32,), 2, dtype=torch.int32)

    bad = resave(saved, tmp_path / "int.safetensors", ints)
    with pytest.raises(CheckpointError, match=re.escape(
        f"{bad}: tensors of another dtype than the model's, which loading would convert without "
        "asking: ln_final.weight (int32, model float32); lmcore never changes a dtype silently: "
        "load with dtype= (--dtype) to convert every tensor, or fix the file"
    )):  # fmt: skip
        lmcore.load(bad)
    asked = lmcore.load(bad, dtype=torch.float32)
    assert torch.equal(asked.ln_final.weight, torch.full((32,), 2.0))


def test_floats_are_widened_but_never_narrowed_silently(saved: Path, tmp_path: Path) -> None:
    def half(state: dict[str, torch.Tensor]) -> None:
        state["ln_final.weight"] = state["ln_final.weight"].to(torch.bfloat16)

    widened = lmcore.load(resave(saved, tmp_path / "w.safetensors", half))  # exact
    assert widened.ln_final.weight.dtype == torch.float32

    # A bfloat16 model with one float32 tensor: loading it would round that tensor.
    bf16 = lmcore.build_model(SPEC, dtype=torch.bfloat16).save(tmp_path / "bf16.safetensors")

    def wide(state: dict[str, torch.Tensor]) -> None:
        state["ln_final.weight"] = torch.full((32,), 1 + 2**-12)  # not a bfloat16 value

    narrowed = resave(bf16, tmp_path / "n.safetensors", wide)
    with pytest.raises(CheckpointError, match=r"ln_final.weight \(float32, model bfloat16\)"):
        lmcore.load(narrowed)
    assert lmcore.load(narrowed, dtype=torch.bfloat16).ln_final.weight.dtype == torch.bfloat16


def test_non_finite_weights_warn_naming_the_tensor_or_fail_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: a NaN in ln_final made greedy `generate` exit 0 with empty output, unannounced.
    model = lmcore.build_model(SPEC)
    with torch.no_grad():
        model.ln_final.weight[3] = float("nan")
        model.lm_head.weight[0, :2] = float("inf")
    path = model.save(tmp_path / "nan.safetensors")  # saved so: its checksums agree
    message = (
        f"{path}: holds weights that are not finite: lm_head.weight (2 inf), ln_final.weight "
        "(1 NaN); the model's outputs will not be finite either (a run that diverged? a damaged "
        "file?)"
    )
    with pytest.warns(NonFiniteWeightsWarning, match=re.escape(message)):
        lmcore.load(path)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        lmcore.load(path, nonfinite="error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lmcore.load(path, nonfinite="ignore")
    code = main(["generate", str(path), "--prompt-ids", "1,2", "--temperature", "0",
                 "--max-new-tokens", "2", "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert code == 0 and err[0] == f"lmcore generate: warning: {message}"


def test_metadata_nested_too_deep_is_one_line(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: a components JSON nested 50,000 deep gave RecursionError tracebacks in load,
    # describe and run.
    def deep(parsed: dict) -> None:
        parsed["__metadata__"]["lmcore.components"] = "[" * 50_000 + "]" * 50_000

    bad = edit(saved, tmp_path / "deep.safetensors", header=deep)
    expected = (
        f"{bad}: has damaged lmcore metadata: lmcore.components cannot be read (JSONDecodeError: "
        "nested deeper than Python's parser follows: line 1 column 1 (char 0)); the file was "
        "edited or damaged after lmcore saved it"
    )
    with pytest.raises(CheckpointError, match=re.escape(expected)):
        lmcore.load(bad)
    for command in (["describe", str(bad)], ["run", str(bad), "--steps", "1"]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"lmcore {command[0]}: error: {expected}\n"


def test_loading_into_another_model_names_both_specs(saved: Path) -> None:
    # The probe: a resumed run whose model differed from its checkpoint's was told about the
    # checkpoint's spec only, as if that were the model being loaded.
    other = lmcore.build_model(SPEC.replace("d_ff=64", "d_ff=96"))
    with pytest.raises(CheckpointError, match=re.escape(
        f"{saved}: its tensors do not fit the model it is loaded into ({other.spec}; the file's "
        f"spec is {read_info(saved).spec}): wrong shape (3)"
    )):  # fmt: skip
        load_weights(other, saved)
