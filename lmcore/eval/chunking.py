"""Text files read and tokenised in bounded chunks, cut where the tokenizer does not merge
across, so that a file of any size is tokenised in the memory of one chunk and the token ids
are those of the whole file tokenised at once.

    size = utf8_size(path, "--text")                   # bytes of its text; refuses non-UTF-8
    for piece in text_chunks(path, encode):            # str pieces, in order
        ids = encode(piece)

The text is what `Path.read_text(encoding="utf-8")` gives (line endings read as `\\n`), read in
blocks of bytes through an incremental decoder, so a UTF-8 sequence split by a block boundary is
decoded whole. A chunk ends at a cut: after a newline or before a space that stands alone
between two characters that are not whitespace (`x\\ny`, `x y`). A byte-level BPE's
pre-tokenizer (GPT-2's expression, Llama 3's, digits split off) never joins the characters
either side of such a cut into one piece, and it splits the text before the cut as it splits
the same text inside the whole, so nothing a BPE merges can cross it. Each cut is also checked
with the tokenizer itself (`CUT_CHECK` characters either side tokenised together and apart must
give the same ids); a cut that fails is not taken. A tokenizer that merges across every such
place (a normalizer that prepends a character to every input) finds no cut within
`MAX_CHUNK` characters, and is refused by name rather than read whole.
"""

from __future__ import annotations

import codecs
import io
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from lmcore.errors import EvalError

__all__ = ["BLOCK_BYTES", "CHUNK_CHARS", "CUT_CHECK", "MAX_CHUNK", "text_chunks", "utf8_size"]

BLOCK_BYTES: Final = 1 << 20  # bytes read at a time
CHUNK_CHARS: Final = 1 << 20  # characters tokenised at a time, about
CUT_CHECK: Final = 256  # characters either side of a cut tokenised to check it
MAX_CHUNK: Final = 16 << 20  # characters without a cut before the file is refused
_TRIES: Final = 8  # cuts checked before reading on

# A lone newline or space between two non-whitespace characters: the cut after the newline,
# before the space (see the module's docstring).
_CUT: Final = re.compile(r"(?<=\S\n)(?=\S)|(?<=\S)(?= \S)")

Encode = Callable[[str], list[int]]


def _decoded(path: Path, option: str, block: int) -> Iterator[tuple[int, str]]:
    """`(bytes read so far, text)` of the file, block by block, decoded as UTF-8 with line
    endings translated as `open()` translates them; `EvalError` at the first byte that is not
    UTF-8, naming its offset."""
    inner = codecs.getincrementaldecoder("utf-8")("strict")
    decoder = io.IncrementalNewlineDecoder(inner, translate=True)
    read = 0
    with open(path, "rb") as f:
        while True:
            data = f.read(block)
            held = len(inner.getstate()[0])  # bytes of a sequence the last block split
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:
                at = read - held + e.start
                raise EvalError(
                    f"{option} {str(path)!r} is not UTF-8 text ({e.reason} at byte {at:,}); give "
                    "UTF-8 text (e.g. convert it with iconv)"
                ) from None
            read += len(data)
            if text:
                yield read, text
            if not data:
                return


def utf8_size(
    path: str | os.PathLike[str], option: str = "--text", block: int = BLOCK_BYTES
) -> int:
    """The UTF-8 bytes of the file's text (as `text_chunks` reads it), reading it once in blocks;
    `EvalError` when it is not UTF-8."""
    return sum(len(text.encode("utf-8")) for _, text in _decoded(Path(path), option, block))


def _cut(text: str, low: int, encode: Encode) -> int | None:
    """The last cut of `text` at or after `low` that leaves `CUT_CHECK` characters after it and
    that the tokenizer confirms, or None."""
    high = len(text) - CUT_CHECK
    if high <= low:
        return None
    found = [m.start() for m in _CUT.finditer(text, low, high)]
    for p in reversed(found[-_TRIES:]):
        left, right = text[max(0, p - CUT_CHECK) : p], text[p : p + CUT_CHECK]
        if encode(left) + encode(right) == encode(left + right):
            return p
    return None


def text_chunks(
    path: str | os.PathLike[str],
    encode: Encode,
    *,
    option: str = "--text",
    chunk: int = CHUNK_CHARS,
    block: int = BLOCK_BYTES,
    limit: int = MAX_CHUNK,
) -> Iterator[str]:
    """The file's text in pieces of about `chunk` characters (at least `chunk // 2` but the
    last), each ending at a cut `encode` does not merge across (see the module's docstring):
    tokenising the pieces one by one gives the ids of the whole text. `EvalError` for a file
    that is not UTF-8, or one with no cut in `limit` characters."""
    p = Path(path)
    pending = ""
    for read, text in _decoded(p, option, block):
        pending += text
        while len(pending) >= chunk + CUT_CHECK:
            at = _cut(pending[: chunk + CUT_CHECK], chunk // 2, encode)
            at = at if at is not None else _cut(pending, chunk, encode)
            if at is None:
                if len(pending) > limit:
                    raise EvalError(
                        f"{option} {str(p)!r}: no place to cut the text for the tokenizer in "
                        f"{len(pending):,} characters before byte {read:,} (it merges across "
                        "every lone newline and space there, or there are none); lmcore reads "
                        f"text in pieces of at most {limit:,} characters: split the file, or "
                        "evaluate prepared data (--data)"
                    )
                break  # read on: a cut may come
            yield pending[:at]
            pending = pending[at:]
    if pending:
        yield pending
