"""Versioned JSON files that lmcore writes and reads back: a run's `run.json`, a data
directory's `meta.json` and a checkpoint's `trainer.json`. Each holds an object with a `format`
name and a `version`; one reader checks both, so that all three name the file and what is wrong
in the same words. No torch here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# Lone surrogates: how Python holds the bytes of a file name that are not UTF-8 (PEP 383).
_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(data: Any, *, indent: int | None = 2) -> str:
    """`data` as JSON text that UTF-8 can always hold: other characters as they are, but a lone
    surrogate (a non-UTF-8 byte of a path, as `os.fsdecode` gives it) as its `\\udcXX`
    escape, which `json.loads` reads back to the same string (so the path round-trips)."""
    text = json.dumps(data, indent=indent, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def read_versioned(
    file: Path,
    *,
    format: str,
    version: int,
    what: str,
    error: type[Exception],
    fix: str | None = None,
) -> dict[str, Any]:
    """The object in `file`. `error` naming the file when it cannot be read or parsed, is not a
    JSON object of `format` (`what` says what it should be, e.g. "an lmcore run description"),
    or has another `version`; `fix`, when given, ends each message."""
    end = f"; {fix}" if fix else ""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"cannot read {file}: {e}{end}") from None
    except RecursionError:
        raise error(
            f"cannot read {file}: it nests deeper than Python's parser follows{end}"
        ) from None
    if not isinstance(data, dict) or data.get("format") != format:
        raise error(f"{file} is not {what} (no format {format!r}){end}")
    if data.get("version") != version:
        raise error(
            f"{file} has {format} version {data.get('version')!r}; this lmcore reads version "
            f"{version}{end}"
        )
    return data
