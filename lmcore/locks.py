"""Directory locks: one lmcore process at a time writes a run, a sweep or a data directory.

    with lock_file(run / LOCK_FILE, what=f"run directory {run}", error=TrainError):
        ...  # train into `run`; a second process gets `TrainError` naming this one

A lock is an OS file lock (`fcntl.flock`, exclusive, non-blocking) on a small file, held while
the work goes on and released by the kernel when the process ends in any way (SIGKILL and
power loss included), so a crash never leaves a directory locked. Whoever holds it writes its
PID, host, start time and command line into the file; a second process that finds the lock
taken reads them and names them in its error. The file itself stays (removing it on release
would let a third process lock a new file while a second still waits on the old one); its
contents mean nothing unless the lock is held.

On platforms without `fcntl` (Windows) `msvcrt.locking` locks the file's first byte instead.
No torch here.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import glob
import json
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from lmcore.atomic import fsync_directory
from lmcore.errors import clip

__all__ = ["LOCK_FILE", "DirectoryLock", "Holder", "lock_file", "new_directory", "sibling_lock"]

LOCK_FILE: Final = ".lock"  # inside a run or sweep directory
_BUSY: Final = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES, errno.EDEADLK}
_WAIT_FOR_HOLDER: Final = 1.0  # seconds to wait for a holder that has not written itself yet


@dataclass(frozen=True)
class Holder:
    """The process holding a lock, as it wrote itself into the lock file."""

    pid: int | None
    host: str
    started: str
    command: str

    def __str__(self) -> str:
        if self.pid is None:
            return "another process (it has not written its PID yet)"
        return f"PID {self.pid} on {self.host}, started {self.started} ({self.command})"

    @classmethod
    def this_process(cls) -> Holder:
        now = datetime.datetime.now(datetime.timezone.utc).astimezone()
        command = " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])
        return cls(os.getpid(), socket.gethostname(), now.isoformat(timespec="seconds"),
                   clip(command, 80, quote=False))  # fmt: skip

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        try:
            data = json.loads(raw.decode("utf-8"))
            pid = data["pid"]
            return cls(int(pid), str(data["host"]), str(data["started"]), str(data["command"]))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            return None


class DirectoryLock:
    """A held lock; `release()` (or leaving the `with` block) lets it go."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None  # type: ignore[assignment]
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # the holder's details no longer apply
            _unlock(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_file(path: str | os.PathLike[str], *, what: str, error: type[Exception]) -> DirectoryLock:
    """Take the lock on the file `path` (created when missing) for `what` (e.g. "run directory
    runs/a"), or raise `error` naming the process that holds it."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        raise error(
            f"cannot lock {what}: {p}: {e.strerror or e}; check that the directory is writable"
        ) from None
    try:
        _lock(fd)
    except OSError as e:
        if e.errno not in _BUSY:
            os.close(fd)
            raise error(
                f"cannot lock {what}: {p}: {e.strerror or e} (a file system without locks?)"
            ) from None
        holder = _holder(fd)
        os.close(fd)
        pid = f" (kill {holder.pid})" if holder.pid is not None else ""
        raise error(
            f"{what} is in use by another lmcore process: {holder}; wait for it to finish or "
            f"stop it{pid}, then try again"
        ) from None
    try:
        me = Holder.this_process()
        body = json.dumps({"pid": me.pid, "host": me.host, "started": me.started,
                           "command": me.command}, ensure_ascii=True)  # fmt: skip
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, body.encode() + b"\n")
    except OSError:
        pass  # the lock holds without the details; a second process says so
    return DirectoryLock(p, fd)


def _holder(fd: int) -> Holder:
    """Who holds the lock on `fd`'s file: read what it wrote, waiting briefly for a process that
    has just taken the lock and not yet written itself."""
    deadline = time.monotonic() + _WAIT_FOR_HOLDER
    while True:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            found = Holder.parse(os.read(fd, 4096))
        except OSError:
            found = None
        if found is not None or time.monotonic() > deadline:
            return found or Holder(None, "", "", "")
        time.sleep(0.05)


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _lock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------ whole directories


def sibling_lock(directory: Path) -> Path:
    """The lock file of a directory that is replaced whole (so that its lock cannot live inside
    it): `.NAME.lock` beside it."""
    return directory.parent / f".{directory.name}.lock"


@contextlib.contextmanager
def new_directory(
    path: str | os.PathLike[str],
    *,
    force: bool,
    what: str,
    error: type[Exception],
    fix: str,
    keep_out: Sequence[tuple[str, str | os.PathLike[str]]] = (),
) -> Iterator[Path]:
    """Write a directory whole: yield a fresh hidden directory beside `path` to fill; when the
    block ends without an exception it takes `path`'s place in one step (renamed into place, or
    swapped with the old directory, which is then removed); when it raises it is removed and
    `path` is untouched. Under the lock `sibling_lock(path)`, so that two writers never mix.

    Without `force` a `path` that is not an empty directory is refused (`error` with `fix`, a
    hint ending the message); with it, the old contents go as a whole. `keep_out` names
    `(what, path)` pairs that must not lie inside `path` (the sources being read), since
    replacing it would delete them. Leftovers of writers that were killed (`.NAME.*.tmp`) are
    removed first.
    """
    dest = Path(os.path.abspath(path))
    if dest.exists() and not dest.is_dir():
        raise error(f"{what} {str(path)!r} is a file, not a directory; choose another path")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot create {what} {str(path)!r}: {e.strerror or e}") from None
    with lock_file(sibling_lock(dest), what=f"{what} {path}", error=error):
        held = _contents(dest)
        if held and not force:
            raise error(
                f"{what} {str(path)!r} is not empty (it holds {_listed(held)}); nothing was "
                f"written: {fix}"
            )
        if held:
            for name, inner in keep_out:
                real = Path(os.path.realpath(inner))
                if real == dest or dest in real.parents:
                    raise error(
                        f"{name} {str(inner)!r} is inside {what} {str(path)!r}, which --force "
                        "would replace whole (deleting it); move it out first, or choose "
                        "another path"
                    )
        _remove_leftovers(dest)
        tmp = dest.parent / f".{dest.name}.{secrets.token_hex(4)}.tmp"
        tmp.mkdir()
        try:
            yield tmp
            fsync_directory(tmp)
            _put_in_place(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _contents(directory: Path) -> list[str]:
    try:
        return sorted(p.name for p in directory.iterdir())
    except FileNotFoundError:
        return []


def _listed(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(clip(n, 40, quote=False) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _remove_leftovers(dest: Path) -> None:
    """Hidden directories a killed writer of `dest` left beside it: new contents never swapped in
    (`.tmp`), and old contents never removed (`.old`, only while `dest` itself is in place)."""
    for p in dest.parent.glob(f".{glob.escape(dest.name)}.*"):
        suffix = p.name.rsplit(".", 1)[-1]
        if p.is_dir() and (suffix == "tmp" or (suffix == "old" and dest.is_dir())):
            shutil.rmtree(p, ignore_errors=True)


def _put_in_place(tmp: Path, dest: Path) -> None:
    if not dest.exists() or not _contents(dest):
        os.replace(tmp, dest)  # onto nothing, or onto an empty directory
    else:
        old = dest.parent / f".{dest.name}.{secrets.token_hex(4)}.old"
        os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except BaseException:
            os.replace(old, dest)
            raise
        fsync_directory(dest.parent)
        shutil.rmtree(old, ignore_errors=True)
        return
    fsync_directory(dest.parent)
