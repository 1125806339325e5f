"""Atomic file writes: whoever reads the destination sees the old file or the new one, never a part.

    with atomic_path("model.safetensors") as tmp:  # write `tmp` by any means, e.g. a library call
        safetensors.torch.save_file(tensors, tmp)
    with atomic_write("progress.json", "w") as f:  # or through a file object
        json.dump(state, f)

The temporary file lives in the destination's directory (a rename is atomic only within one file
system) under a hidden name, `.NAME.<random>.tmp`. When the block ends without an exception the
file is flushed to disk (fsync), renamed over the destination (`os.replace`), and the directory is
fsync'ed so that the rename itself survives a power loss. The file that replaces the destination
has the mode a plain `open(path, "w")` of a new file gives (0o666 less the umask), even when the
block wrote it by replacing the temporary file (safetensors renames its own 0o600 file over it):
others on a shared machine may read a checkpoint as they may read its JSON. When the block
raises, the temporary file is removed and the destination is untouched; an `OSError` about the
temporary file (a full disk) names the destination instead. A destination that is a directory is
refused first. A process killed outright (SIGKILL, power loss) may leave a stale temporary file
beside the destination, never a partial file under its name.

No torch here: the training runner uses these helpers for its own files too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from lmcore.errors import ConfigError

__all__ = ["atomic_path", "atomic_write", "fsync_directory"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary path beside `path`; on success it replaces `path` atomically.

    The temporary file exists (empty) when the block starts, created with the permissions a plain
    `open(path, "w")` would give (0o666 less the umask); the file renamed into place has them too,
    whatever wrote it.
    """
    dest = Path(path)
    if dest.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory; give a file path", str(dest))
    directory = dest.parent
    tmp, mode = _create_temporary(directory, dest.name)
    try:
        yield tmp
        _restore_mode(tmp, mode)
        _fsync_file(tmp)
        os.replace(tmp, dest)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if e.filename in (str(tmp), tmp):  # name the file the caller asked for, not ours
            raise type(e)(e.errno, e.strerror, str(dest)) from None
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(directory)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """`open(path, mode)` that replaces `path` atomically when the block ends without an exception.

    `mode` is "w" or "wb" (optionally with "+"); text mode defaults to UTF-8.
    """
    if not mode.startswith("w") or set(mode) - set("wb+"):
        raise ConfigError(
            f"atomic_write writes a whole new file: mode must be 'w' or 'wb', not {mode!r}"
        )
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding) as f:
        yield f


def fsync_directory(directory: str | os.PathLike[str]) -> None:
    """Make a rename or file creation in `directory` durable (a no-op where directories cannot be
    opened, e.g. on Windows)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory; the rename is still atomic
        pass
    finally:
        os.close(fd)


def _create_temporary(directory: Path, name: str) -> tuple[Path, int]:
    """A new empty file beside `directory / name`, and its permission bits: what the system gives
    a file created 0o666 there (the umask, or a default ACL, applied), read back rather than
    computed, since reading the umask means setting it, which races with other threads."""
    for _ in range(100):
        tmp = directory / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        return tmp, mode
    raise FileExistsError(f"could not create a temporary file beside {directory / name}")


def _restore_mode(tmp: Path, mode: int) -> None:
    """Give `tmp` the permission bits it was created with, if whatever wrote it replaced it by a
    file of its own (safetensors writes 0o600 files and renames them over their destination)."""
    if stat.S_IMODE(tmp.stat().st_mode) != mode:
        os.chmod(tmp, mode)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
