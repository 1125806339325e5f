"""Atomic writes: a failure or a kill during a save leaves the previous file intact.

Fault injection makes the write fail halfway through; the kill tests SIGKILL a real process
while it saves: halfway through writing the bytes, and after writing them but before the rename.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.atomic import atomic_path, atomic_write
from lmcore.checkpoint import read_info
from lmcore.hf import save_hf

SMALL = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_atomic_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    with atomic_write(path, "w") as f:
        f.write("new")
        assert path.read_text() == "old"  # not visible until the block ends
    assert path.read_text() == "new"
    assert leftovers(tmp_path) == []


def test_the_file_gets_ordinary_permissions(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.bin") as f:
            f.write(b"x")
    finally:
        os.umask(umask)
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002], ids=oct)
def test_a_checkpoint_and_its_json_get_the_umasks_mode(tmp_path: Path, umask: int) -> None:
    # safetensors writes its own 0o600 file and renames it over the temporary one; the file put
    # in place must still have what a plain open gives, as its JSON neighbour has
    previous = os.umask(umask)
    try:
        model = lmcore.build_model(SMALL)
        model.save(tmp_path / "model.safetensors")
        save_hf(model, tmp_path / "hf")
        with atomic_write(tmp_path / "run.json", "w") as f:
            f.write("{}")
    finally:
        os.umask(previous)
    written = [tmp_path / "model.safetensors", tmp_path / "run.json", *(tmp_path / "hf").iterdir()]
    assert {p.name for p in written} >= {"config.json", "model.safetensors"}
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in written}
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))


def test_an_exception_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_write(path, "w") as f:
        f.write("half of the new cont")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_atomic_write_refuses_append_and_read_modes(tmp_path: Path) -> None:
    for mode in ("a", "r+", "ab"):
        with (
            pytest.raises(ValueError, match="mode must be 'w' or 'wb'"),
            atomic_write(tmp_path / "x", mode),
        ):
            pass


def test_fsyncs_the_file_before_the_rename_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(
        os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1]
    )
    with atomic_path(tmp_path / "f") as tmp:
        tmp.write_bytes(b"data")
    assert events == ["fsync", "replace", "fsync"]


@pytest.fixture
def old(tmp_path: Path) -> tuple[Path, str]:
    torch.manual_seed(0)
    path = lmcore.build_model(SMALL).save(tmp_path / "m.safetensors")
    return path, digest(path)


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint(
    old: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, before = old

    def failing_save_file(tensors, filename, metadata=None) -> None:
        with open(filename, "wb") as f:
            f.write(b"\x00" * 4096)  # part of the new file is on disk ...
        raise OSError(28, "No space left on device")  # ... when the disk fills up

    monkeypatch.setattr("lmcore.model.saving.save_file", failing_save_file)
    torch.manual_seed(1)
    with pytest.raises(OSError, match="No space left on device"):
        lmcore.build_model(SMALL).save(path)
    assert digest(path) == before
    assert leftovers(path.parent) == []
    lmcore.load(path)  # still a whole checkpoint


def test_a_failing_rename_leaves_the_previous_checkpoint(
    old: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, before = old

    def no_rename(a: object, b: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(PermissionError):
        lmcore.build_model(SMALL).save(path)
    assert digest(path) == before and leftovers(path.parent) == []


# A child that saves over `path` and stops, to be killed, at a chosen moment: "mid-write" (half
# of the new file's bytes are written and flushed) or "before-rename" (the new file is complete).
KILLED_WHILE_SAVING = """
import sys, time
import safetensors.torch, torch
import lmcore, lmcore.atomic, lmcore.model.saving

path, marker, spec, moment = sys.argv[1:5]

def stop_here():
    open(marker, "w").close()
    time.sleep(60)

def slow_save_file(tensors, filename, metadata=None):
    data = safetensors.torch.save(tensors, metadata=metadata)
    with open(filename, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        stop_here()
        f.write(data[len(data) // 2 :])

if moment == "mid-write":
    lmcore.model.saving.save_file = slow_save_file
else:
    lmcore.atomic._fsync_file = lambda p: stop_here()
torch.manual_seed(1)
lmcore.build_model(spec).save(path)
"""


@pytest.mark.parametrize("moment", ["mid-write", "before-rename"])
def test_a_process_killed_while_saving_leaves_the_previous_checkpoint(
    old: tuple[Path, str], moment: str
) -> None:
    """SIGKILL halfway through writing the new file's bytes (where a plain `open(path, "wb")`
    would leave a truncated checkpoint), or once it is written but not yet renamed."""
    path, before = old
    marker = path.parent / "stopped"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WHILE_SAVING, str(path), str(marker), SMALL, moment],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        if child.poll() is not None:
            raise AssertionError(child.stderr.read().decode() if child.stderr else "child died")
        assert time.monotonic() < deadline, "the child never reached the point to kill it at"
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    assert digest(path) == before
    lmcore.load(path)
    # The new file is left only under a hidden temporary name beside it.
    [stale] = leftovers(path.parent)
    assert stale.startswith(".m.safetensors.")
    if moment == "before-rename":
        assert read_info(path.parent / stale).spec == read_info(path).spec
