"""Which files a SOURCE names, and their text as a stream of chunks that encode like the whole.

A SOURCE is a file (always read, whatever its name) or a directory, walked recursively in sorted
order: a file there counts when its extension is one of `extensions` (case-insensitive), no part
of its path below the SOURCE starts with "." (hidden files and directories, `.git`), and no
`exclude` glob matches its relative path or one of its parts (`--exclude test` drops every
directory named `test`, `--exclude "*_test.py"` those files). Symbolic links to directories
are not followed; the output directory is never read.

Text is UTF-8, strict. `read_chunks` yields a file's text in pieces of about `chunk_bytes`, each
cut just before a space or newline that follows a non-space character. No pre-token of the
byte-level BPE (GPT-2's pattern) spans such a point and none looks past it, so encoding the
pieces one by one gives exactly the ids of encoding the whole text (a test holds this for
arbitrary Unicode), and a file larger than memory is read in bounded pieces. A piece grows past
`chunk_bytes` only while no cut point appears; after `MAX_RUN` characters without one (a
megabyte with no space or newline: minified code, random or DNA-like text) it is cut where it
is, but never inside an added token such as `<|endoftext|>`, so that memory stays bounded. Only
there can the ids differ from those of the whole text (no token spans that cut).
"""

from __future__ import annotations

import codecs
import errno
import fnmatch
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lmcore.data.meta import EOT
from lmcore.errors import DataError, did_you_mean, one_of

DEFAULT_EXTENSIONS = (".txt", ".md", ".rst", ".py")
CHUNK_BYTES = 1 << 16  # read per block; a chunk of text is about this long
MAX_RUN = 1 << 20  # characters without a cut point after which a piece is cut where it is
PROTECTED = (EOT,)  # added tokens a forced cut never splits (a reused tokenizer may add more)


@dataclass(frozen=True)
class SourceFile:
    """One file to read: where it is, which SOURCE argument it came from, its size in bytes."""

    path: Path
    source: int  # index into the SOURCE arguments
    size: int


def normalise_extensions(extensions: Sequence[str]) -> tuple[str, ...]:
    """`py`, `.PY` → `.py`; an empty extension is an error."""
    found = []
    for ext in extensions:
        e = ext.strip().lower()
        if e in ("", "."):
            raise DataError(f"empty file extension {ext!r}; give extensions like --ext .txt")
        found.append(e if e.startswith(".") else f".{e}")
    if not found:
        raise DataError("no file extensions given; give at least one, e.g. --ext .txt")
    return tuple(dict.fromkeys(found))


def find_files(
    sources: Sequence[Path],
    *,
    extensions: Sequence[str],
    exclude: Sequence[str] = (),
    skip: Path | None = None,
) -> list[SourceFile]:
    """Every file the SOURCEs name, in order; each file once (the first time it is named).

    `skip` is a directory never read (the output directory). An empty list is never returned:
    a SOURCE that does not exist, or a directory with no file to read, is an error.
    """
    exts = normalise_extensions(extensions)
    skip_real = os.path.realpath(skip) if skip is not None else None
    seen: set[str] = set()
    files: list[SourceFile] = []
    for index, source in enumerate(sources):
        if not source.exists():
            raise DataError(_missing(source))
        if source.is_file():
            found = [source]
        elif source.is_dir():
            found = list(_walk(source, exts, exclude, skip_real))
            if not found:
                raise DataError(_no_files(source, exts, exclude))
        else:
            raise DataError(f"source {str(source)!r} is neither a regular file nor a directory")
        for path in found:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                files.append(SourceFile(path=path, source=index, size=path.stat().st_size))
    return files


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    parts = rel.split("/")
    return any(
        fnmatch.fnmatchcase(rel, p) or any(fnmatch.fnmatchcase(part, p) for part in parts)
        for p in patterns
    )


def _walk(
    root: Path, exts: tuple[str, ...], exclude: Sequence[str], skip: str | None
) -> Iterator[Path]:
    for here, dirs, names in os.walk(root):  # top-down, so pruning `dirs` prunes the walk
        base = Path(here)
        rel_here = base.relative_to(root).as_posix()
        prefix = "" if rel_here == "." else f"{rel_here}/"
        dirs[:] = sorted(
            d
            for d in dirs
            if not d.startswith(".")
            and not _excluded(prefix + d, exclude)
            and os.path.realpath(base / d) != skip
        )
        for name in sorted(names):
            if (
                not name.startswith(".")
                and os.path.splitext(name)[1].lower() in exts
                and not _excluded(prefix + name, exclude)
            ):
                yield base / name


def _missing(source: Path) -> str:
    if source.is_symlink():  # it exists, as a link to nothing: a loop, or a missing target
        try:
            source.resolve(strict=True)
            why = "cannot be followed"
        except RuntimeError:  # Python 3.11-3.12 report a loop so
            why = "is part of a loop of links"
        except OSError as e:
            why = "is part of a loop of links" if e.errno == errno.ELOOP else "points to nothing"
        return (
            f"source {str(source)!r} is a symbolic link that {why} (it links to "
            f"{os.readlink(source)!r}); fix or remove the link"
        )
    parent = source.parent if str(source.parent) else Path(".")
    try:
        siblings = [p.name for p in parent.iterdir()] if parent.is_dir() else []
    except OSError:
        siblings = []
    return (
        f"source {str(source)!r} does not exist{did_you_mean(source.name, siblings)}; "
        "give text files or directories that hold them"
    )


def _no_files(source: Path, exts: tuple[str, ...], exclude: Sequence[str]) -> str:
    others: dict[str, int] = {}
    for _, _, names in os.walk(source):
        for name in names:
            ext = os.path.splitext(name)[1].lower()
            if ext and ext not in exts:
                others[ext] = others.get(ext, 0) + 1
    common = sorted(others, key=lambda e: (-others[e], e))[:5]
    hint = (
        f"; it holds {', '.join(f'{others[e]} {e}' for e in common)} files: choose extensions "
        f"with --ext, e.g. --ext {common[0]}"
        if common
        else ""
    )
    excluded = f" not excluded by {', '.join(exclude)}," if exclude else ""
    return (
        f"directory {str(source)!r} holds no{excluded} non-hidden file ending in "
        f"{one_of(exts)}{hint}"
    )


class UndecodableError(DataError):
    """A file holds bytes that are not UTF-8; `path` and `offset` say where."""

    def __init__(self, path: Path, offset: int, error: UnicodeDecodeError):
        self.path, self.offset = path, offset
        bad = bytes(error.object[error.start : error.end])
        super().__init__(
            f"{path}: byte offset {offset}: {bad!r} is not valid UTF-8 ({error.reason}); "
            "lmcore reads text as UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8), "
            f"exclude it (--exclude {path.name}) or skip every such file (--skip-undecodable)"
        )


def read_chunks(
    path: Path,
    chunk_bytes: int = CHUNK_BYTES,
    on_bytes: Callable[[int], None] | None = None,
    *,
    max_run: int = MAX_RUN,
    protect: Sequence[str] = PROTECTED,
) -> Iterator[str]:
    """The text of `path` in pieces that encode exactly like the whole (see the module doc).

    `on_bytes(n)` is called as each block of `n` bytes is read (for a progress bar). Bytes that
    are not UTF-8 raise `DataError` naming the file and the byte offset. A piece of `max_run`
    characters without a cut point is cut where it is, outside every token of `protect`.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    pending = ""
    start = 0  # where `pending` may hold a cut point
    consumed = 0
    try:
        f = path.open("rb")
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}; check its permissions") from None
    with f:
        while True:
            try:
                block = f.read(chunk_bytes)
            except OSError as e:
                raise DataError(f"cannot read {path}: {e.strerror}") from None
            held = len(decoder.getstate()[0])  # bytes of a character split across blocks
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                raise UndecodableError(path, consumed - held + e.start, e) from None
            consumed += len(block)
            if on_bytes is not None and block:
                on_bytes(len(block))
            pending += text
            if not block:
                break
            cut = safe_cut(pending, start)
            if not cut and len(pending) >= max_run:
                cut = forced_cut(pending, protect)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
                start = 0
            else:  # no cut point so far: next time look only where the new text joins it
                start = max(len(pending) - 1, 0)
    if pending:
        yield pending


def safe_cut(text: str, start: int = 0) -> int:
    """The last index `i` (at or after `start`) where `text[i]` is a space or newline and
    `text[i-1]` is not whitespace, preferring a newline; 0 when there is none.

    Python's `str.isspace` accepts every character the tokenizer's `\\s` does (and a few
    more, which only makes the rule stricter), so no pre-token crosses `i`.
    """
    for mark in ("\n", " "):
        i = len(text)
        while (i := text.rfind(mark, max(start, 1), i)) > 0:
            if not text[i - 1].isspace():
                return i
    return 0


def forced_cut(text: str, protect: Sequence[str] = PROTECTED) -> int:
    """Where to cut `text`, which has no cut point, so that no token of `protect` is split: near
    its end, leaving room for a token that the next block may complete, and before any
    occurrence of one that would span the cut. At least 1, for a non-empty `text`."""
    longest = max((len(t) for t in protect), default=1)
    cut = max(len(text) - longest + 1, 1)
    for _ in range(4 * len(protect)):  # overlapping tokens could move it back and forth
        spans = [j for t in protect
                 if 0 <= (j := text.find(t, max(cut - len(t) + 1, 0), cut + len(t) - 1)) < cut
                 and cut < j + len(t)]  # fmt: skip
        if not spans:
            break
        j = min(spans)  # before the token, or after it when it starts the text
        cut = j if j > 0 else len(next(t for t in protect if text.startswith(t)))
    return cut


def check_utf8(path: Path, chunk_bytes: int = CHUNK_BYTES) -> UndecodableError | None:
    """The error `read_chunks` would raise for bytes of `path` that are not UTF-8, or None."""
    try:
        for _ in read_chunks(path, chunk_bytes):
            pass
    except UndecodableError as e:
        return e
    return None
