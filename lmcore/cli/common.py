"""What the commands share: the usage error, option types, the SPEC-or-checkpoint argument, the
dtype and byte formats, and the exit status of a training run.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lmcore.errors import CheckpointWarning, LmcoreError
from lmcore.train.options import positive as positive
from lmcore.train.options import seed_value as seed_value

if TYPE_CHECKING:
    from lmcore.checkpoint import CheckpointInfo
    from lmcore.sources import Location, Source


class UsageError(LmcoreError, ValueError):
    """A command-line option does not fit the spec (e.g. --seq beyond context_length)."""


def say(line: str) -> None:
    print(line, file=sys.stderr)


DTYPES = ("bfloat16", "float16", "float32")

MAX_BYTES_HELP = (
    "refuse a model (and step) needing more memory than this, e.g. 8GiB or 500MB "
    "(default: the memory available on the device)"
)

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50}  # fmt: skip

OR_CHECKPOINT = (
    "or a checkpoint path (.safetensors), or a Hugging Face model directory or config.json "
    "(its architecture, as `lmcore convert --from-hf DIR --print-spec` gives it)"
)

DTYPE_HELP = "default: float32, or a checkpoint's own dtype"
COMPILE_HELP = (
    "compile each layer's decoding step with torch.compile (inductor, C++ wrapper): on a "
    "2-core CPU SmolLM2-135M's first token comes 6-18 s after the start (inductor's cache on "
    "disk warm or cold; 2 s eager), then it decodes 1.4-1.9x as fast as eager; pays off for "
    "long outputs"
)


def source(args: argparse.Namespace) -> Source:
    """The model of a command's SPEC argument: a spec string, a checkpoint file (with its
    info), or a Hugging Face model directory or config.json (the architecture only; `lmcore
    convert --from-hf` brings the weights), read and resolved (`lmcore.sources.locate`)."""
    from lmcore.sources import locate

    return opened(args, locate(args.spec))


def opened(args: argparse.Namespace, where: Location) -> Source:
    """`where.open()`, a checkpoint's (or a spec's plugins') warnings printed as the command's
    (`checkpoint_warnings`); a Hugging Face config's show as they come."""
    if where.kind == "hf":
        return where.open()
    with checkpoint_warnings(args.command):
        return where.open()


@contextlib.contextmanager
def checkpoint_warnings(command: str) -> Iterator[None]:
    """Print a checkpoint's provenance warnings as `lmcore CMD: warning: ...`; other warnings
    pass through as before."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        yield
    for w in caught:
        if issubclass(w.category, CheckpointWarning):
            print(f"lmcore {command}: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


def torch_dtype(args: argparse.Namespace, info: CheckpointInfo | None) -> Any:
    """`--dtype` as a torch dtype; by default a checkpoint's own, else float32."""
    import torch

    if args.dtype is not None:
        return getattr(torch, args.dtype)
    return info.torch_dtype if info is not None else torch.float32


def byte_count(text: str) -> int:
    m = re.fullmatch(r"\s*(\d{1,20}(?:\.\d{1,10})?)\s*([A-Za-z]*)\s*", text)
    unit = m[2].upper() if m else ""
    if m is None or unit not in _UNITS or float(m[1]) * _UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes such as 8GiB, 500MB or 1000000, got {text!r}"
        )
    return int(float(m[1]) * _UNITS[unit]) if "." in m[1] else int(m[1]) * _UNITS[unit]


def check_seq(args: argparse.Namespace, context_length: int) -> None:
    if args.seq is not None and args.seq > context_length:
        raise UsageError(
            f"--seq {args.seq} exceeds context_length={context_length} of this spec; "
            f"use --seq {context_length} or less, or raise the context in the spec: "
            f'"{args.spec}, context_length={args.seq}"'
        )


def show_bytes(n: int) -> str:
    """Binary prefixes, as memory is sized: 7.92 GiB (`lmcore.model.counting.format_bytes`)."""
    from lmcore.model.counting import format_bytes

    return format_bytes(n)


def exit_code(status: str, reason: str | None) -> int:
    """0 done; 1 diverged; 128 + the signal when stopped by one (130 Ctrl-C, 143 SIGTERM)."""
    if status == "done":
        return 0
    if status == "interrupted" and reason in ("SIGINT", "SIGTERM"):
        import signal

        return 128 + int(signal.Signals[reason])
    return 1
