"""The checkpoint file at the byte level, before lmcore's metadata is read: the safetensors header
parsed and checked by lmcore itself (so a damaged file gets a message saying what is wrong with
it), each tensor's bytes verified against the CRC-32 saved with it, and the tensors read.
`lmcore.model.saving` writes the files; `lmcore.checkpoint` reads their metadata and loads models.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from lmcore.errors import CheckpointError
from lmcore.model.saving import CHECKSUM, KEYS, checksum
from lmcore.runfiles import hf_hint

__all__ = [
    "Header",
    "TensorInfo",
    "listed",
    "load_json",
    "read_checksums",
    "read_header",
    "read_tensors",
    "verify_checksums",
    "verify_metadata",
]


_MAX_HEADER: Final = 100_000_000  # safetensors' own limit on the JSON header

# Bytes per element of each safetensors dtype (the sub-byte and exotic ones are not size-checked).
_ITEMSIZE: Final = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it: safetensors dtype code (e.g. "F32"), shape, and
    where its bytes lie (offsets from the start of the data, which follows the header)."""

    dtype: str
    shape: tuple[int, ...]
    offsets: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Header:
    """A safetensors file's header: its string metadata and its tensors, no data read."""

    path: Path
    metadata: Mapping[str, str]
    tensors: Mapping[str, TensorInfo]
    size: int  # of the whole file, in bytes
    data_start: int = 0  # the byte of the file where the tensors' data begins

    @property
    def checksums(self) -> Mapping[str, str] | None:
        """`lmcore.checksums`' table {tensor: CRC-32 hex}; None when the file has none."""
        return read_checksums(self.path, self.metadata)


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and check a safetensors file's header without touching its tensor data.

    Raises `CheckpointError` for a missing file, a file that is not safetensors, one cut short,
    or one whose header is damaged.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            (length,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
            raw = f.read(length) if 0 < length <= _MAX_HEADER else b""
    except FileNotFoundError:
        raise CheckpointError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{p}: is a directory, not a checkpoint file{hf_hint(p)}") from None
    except OSError as e:
        raise CheckpointError(f"{p}: cannot be read: {e.strerror or e}") from None
    if len(head) < 8 or not raw.startswith(b"{"):
        raise _not_safetensors(p, head, size)
    if len(raw) < length:
        raise CheckpointError(
            f"{p}: is truncated: its safetensors header needs {length:,} bytes after the first 8, "
            f"but the file holds only {size:,} bytes in all; it was cut short (an interrupted "
            "copy or download?): copy it again"
        )

    def corrupted(problem: str) -> CheckpointError:
        return CheckpointError(
            f"{p}: has a corrupted safetensors header: {problem}; the file is damaged, restore it "
            "from a good copy"
        )

    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise corrupted(f"it is not valid JSON ({e})") from None
    except RecursionError:
        raise corrupted("its JSON nests deeper than Python's parser follows") from None
    if not isinstance(parsed, dict):
        raise corrupted(f"it is a JSON {type(parsed).__name__}, not an object")
    metadata = parsed.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise corrupted("__metadata__ is not a mapping of strings to strings")
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in parsed.items():
        fields = entry if isinstance(entry, dict) else {}
        dtype, shape, offsets = fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")
        if (
            not isinstance(dtype, str)
            or not isinstance(shape, list)
            or not all(isinstance(n, int) and n >= 0 for n in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(n, int) for n in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise corrupted(f"the entry of tensor {name!r} is malformed: {entry!r}")
        numel = 1
        for n in shape:
            numel *= n
        if dtype in _ITEMSIZE and offsets[1] - offsets[0] != numel * _ITEMSIZE[dtype]:
            raise corrupted(
                f"tensor {name!r} ({dtype}, shape {tuple(shape)}) should take "
                f"{numel * _ITEMSIZE[dtype]:,} bytes, its offsets give {offsets[1] - offsets[0]:,}"
            )
        tensors[name] = TensorInfo(dtype, tuple(shape), (offsets[0], offsets[1]))
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for start, stop, name in sorted(spans):
        if start != end:
            raise corrupted(f"tensor {name!r} starts at byte {start:,} of the data, not {end:,}")
        end = stop
    data = size - 8 - length
    if end > data:
        raise CheckpointError(
            f"{p}: is truncated: its header describes {end:,} bytes of tensor data but the file "
            f"holds {data:,}; it was cut short (an interrupted copy or download?): copy it again"
        )
    if end < data:
        raise corrupted(f"{data - end:,} bytes follow the last tensor")
    return Header(p, metadata, tensors, size, 8 + length)


def _not_safetensors(p: Path, head: bytes, size: int) -> CheckpointError:
    if head.startswith(b"PK\x03\x04"):
        what = (
            "it is a zip archive, which is what torch.save writes: for a CS336-keyed state dict "
            "use lmcore.load_state_dict_file(path, spec)"
        )
    elif head.startswith(b"\x80"):
        what = "it is a pickle, which lmcore never loads (unpickling can run code)"
    elif size < 8:
        what = f"it is only {size} bytes long"
    else:
        what = "it does not start with a safetensors header"
    return CheckpointError(
        f"{p}: is not a safetensors file ({what}); lmcore checkpoints are written by "
        "lmcore.save / `lmcore build SPEC --save PATH`"
    )


def load_json(text: str) -> Any:
    """`json.loads`, with nesting too deep for Python's parser a `json.JSONDecodeError` too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested deeper than Python's parser follows", text, 0) from None


def read_checksums(path: Path, metadata: Mapping[str, str]) -> Mapping[str, str] | None:
    raw = metadata.get(KEYS["checksums"])
    if raw is None:
        return None
    try:
        parsed = load_json(raw)
        table = parsed["tensors"]
        strings = parsed.get("algorithm") == CHECKSUM and all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()
        )
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise _damaged(path, f"{type(e).__name__}: {e}") from None
    if not strings:
        raise _damaged(path, f"TypeError: not a {CHECKSUM} table of strings")
    return dict(table)


def _damaged(path: Path, problem: str) -> CheckpointError:
    """`lmcore.checksums` cannot be read: `problem`, as the reader found it."""
    return CheckpointError(
        f"{path}: has damaged lmcore metadata: {KEYS['checksums']} cannot be read ({problem}); "
        "the file was edited or damaged after lmcore saved it"
    )


def verify_metadata(path: Path, metadata: Mapping[str, str]) -> None:
    """Check the metadata entries that `lmcore.checksums` covers (the tokenizer's) against their
    CRC-32, and that each one it names is there: `CheckpointError` naming each that differs.
    Cheap (the entries are in the header already), so `read_info` always does it."""
    raw = metadata.get(KEYS["checksums"])
    if raw is None:
        return
    try:
        table = load_json(raw).get("metadata", {})
    except (json.JSONDecodeError, AttributeError) as e:
        raise _damaged(path, f"{type(e).__name__}: {e}") from None
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise _damaged(path, "TypeError: not a table of strings")
    differ = sorted(
        key
        for key, crc in table.items()
        if key not in metadata or checksum(metadata[key].encode("utf-8")) != crc
    )
    if differ:
        raise CheckpointError(
            f"{path}: fails its integrity check: the metadata {listed(differ)} does not match "
            f"its {CHECKSUM} (or is missing). The file was damaged or changed after lmcore "
            "saved it: restore it from a good copy"
        )


class _Stored(Protocol):
    """What `verify_checksums` reads: a `Header`, or a checkpoint's info built on one."""

    @property
    def path(self) -> Path: ...
    @property
    def tensors(self) -> Mapping[str, TensorInfo]: ...
    @property
    def data_start(self) -> int: ...
    @property
    def checksums(self) -> Mapping[str, str] | None: ...


def verify_checksums(source: _Stored) -> None:
    """Check every stored tensor's bytes against the CRC-32 saved with it (`lmcore.checksums`),
    reading the file once, through a memory map. `CheckpointError` naming each tensor whose
    bytes differ (flipped bytes; two tensors' offsets swapped; data of another tensor), and each
    one the table lacks or names without the file holding it. A file saved without checksums
    (before lmcore wrote them) has nothing to verify and passes."""
    sums = source.checksums
    if sums is None:
        return
    problems = []
    stored = set(source.tensors)
    extra = sorted(set(sums) - stored)
    if extra:
        problems.append(f"checksums of tensors it does not hold: {listed(extra)}")
    lacking = sorted(stored - set(sums))
    if lacking:
        problems.append(f"no checksum for {listed(lacking)}")
    differ: list[str] = []
    with open(source.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            for name, t in source.tensors.items():
                start, end = (source.data_start + o for o in t.offsets)
                if name in sums and checksum(view[start:end]) != sums[name]:
                    differ.append(name)
        finally:
            view.release()
    if differ:
        problems.insert(0, f"the bytes of {listed(differ)} do not match their {CHECKSUM}")
    if problems:
        raise CheckpointError(
            f"{source.path}: fails its integrity check: {'; '.join(problems)}. The file was "
            "damaged or changed after lmcore saved it (a bad disk or copy?): restore it from a "
            "good copy (lmcore.load(..., verify=False) loads it unchecked)"
        )


def read_tensors(path: Path, device: torch.device) -> dict[str, Tensor]:
    """Every tensor of a safetensors file (whose header `read_header` has checked) on `device`."""
    where = "cpu" if device.type == "meta" else str(device)
    try:
        return load_file(str(path), device=where)
    except SafetensorError as e:  # what the header check cannot see
        raise CheckpointError(f"{path}: safetensors cannot read it: {e}") from None
    except (OSError, RuntimeError) as e:
        # safetensors opens the file again (torch maps it: a RuntimeError), naming no file: a
        # file removed meanwhile (a training run pruning it) is said to be, with its name.
        if (isinstance(e, OSError) and e.filename is not None) or path.exists():
            raise
        raise FileNotFoundError(
            errno.ENOENT, f"removed while its tensors were read ({e})", str(path)
        ) from None


_LISTED: Final = 12  # names shown per group in a mismatch message


def listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... and {len(names) - _LISTED} more" if len(names) > _LISTED else "")
