"""The `lmcore` console script: the parser, and the exit-status contract every command keeps.

lmcore build SPEC           build a model; print its canonical spec and parameter count
lmcore describe SPEC        parameters, FLOPs and memory by component, before any weight exists
lmcore run SPEC             forward+backward steps on random tokens: tokens/s and peak memory
lmcore plugins              list components, presets and plugins with provenance and status
lmcore convert              Hugging Face directory or GGUF file <-> lmcore checkpoint
lmcore quantize CKPT        a checkpoint with its matrices stored int8 or int4
lmcore data prepare SRC...  train a BPE tokenizer and write token ids for training
lmcore train SPEC           train a model on prepared data: checkpoints, metrics, loss curve
lmcore sweep BASE --vary    train a baseline and its variants alike; compare them
lmcore ladder BASE --vary   a baseline and its variants at sizes stepping by a factor; scaling laws
lmcore compare RUN...       the comparison table and plot of existing runs
lmcore quickstart           train a small model on this Python's standard library (a minute)
lmcore generate SPEC|CKPT   write text (or token ids) from a prompt, streaming, with a KV cache
lmcore chat CKPT            an interactive chat in the model's template, KV cache kept
lmcore eval MODEL           loss, perplexity, bits per byte; lm-evaluation-harness tasks
lmcore coordcheck SPEC      muP's coordinate check: activation updates by width, muP beside SP
lmcore --version            lmcore's, torch's and Python's versions

Each command is a module of this package (`add_parser(sub)`, `run(args) -> int`), listed in
`COMMANDS` in the order `lmcore --help` shows them.

Wherever a SPEC is taken, a checkpoint path is too (a name ending in .safetensors, or a path with
a directory separator and no '='): its embedded spec is used, resolved against the plugins that
saved it.

Exit status: 0 done; 2 the input is wrong (spec, options, environment variables, plugins), with
a one-line message on stderr (plus the caret display for spec errors); 1 lmcore failed: a bug
(with a traceback), a check that `describe --measure` or `run` reports, output that could
not be written, or a system error that names no file (in one line, saying what was being done);
130 interrupted (Ctrl-C). Output that the terminal's encoding cannot show
(e.g. `×` under PYTHONIOENCODING=ascii) is written with ASCII stand-ins.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import io
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, NoReturn

from lmcore.cli import (
    build,
    chat,
    compare,
    convert,
    coordcheck,
    data,
    describe,
    eval,
    generate,
    ladder,
    plugins,
    quantize,
    quickstart,
    run,
    sweep,
    train,
)
from lmcore.cli.common import say
from lmcore.errors import LmcoreError, LmcoreWarning, SlowPluginWarning, SpecError

# The commands, in the order `lmcore --help` lists them.
COMMANDS: tuple[ModuleType, ...] = (
    build, describe, run, plugins, convert, quantize, data, train, sweep, ladder, compare,
    quickstart, generate, chat, eval, coordcheck,
)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    with _ascii_fallback(), warnings.catch_warnings():
        parser = _parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help, or a usage error already reported in one line
            return int(e.code or 0)
        prog = f"lmcore {args.command}"
        if sys.stdout is None:  # started with stdout closed (`lmcore plugins >&-`)
            say(f"{prog}: error: cannot write the output: stdout is closed; redirect it, e.g. "
                "> /dev/null to discard it")  # fmt: skip
            return 1
        warnings.simplefilter("ignore", LmcoreWarning)  # `lmcore plugins` prints them itself
        warnings.simplefilter("always", SlowPluginWarning)  # ... but not a plugin still loading
        warnings.showwarning = lambda message, *_: say(f"{prog}: warning: {message}")
        try:
            from lmcore.registry import guard_torch_import  # before any command imports torch

            for problem in guard_torch_import():
                say(f"{prog}: warning: {problem}")
            code: int = args.func(args)
            sys.stdout.flush()  # a full disk or closed pipe shows here, not at exit
        except LmcoreError as e:
            say(f"{prog}: error: {_one_line(e)}")
            return 2
        except KeyboardInterrupt:
            say(f"{prog}: interrupted")
            return 130  # as a shell reports a process ended by SIGINT
        except BrokenPipeError:  # `lmcore plugins | head`
            _silence_stdout()
            return 0
        except OSError as e:
            if e.filename is not None:  # a path the command was given (--save, --out, ...)
                fix = _FULL.get(e.errno or 0, "")
                say(f"{prog}: error: {e.filename}: {e.strerror or e}{fix}")
                return 2
            if not _is_stdout_error(e):
                # No file named (safetensors' and tokenizers' errors name none): say what was
                # being done, in one line, rather than a traceback.
                say(f"{prog}: error: {_one_line_os(e)} (while {_doing(e)}; a file it read "
                    "may have been removed or changed meanwhile: try again)")  # fmt: skip
                return 1
            _silence_stdout()
            say(f"{prog}: error: cannot write the output: {e}")
            return 1
        return code


def _one_line(e: LmcoreError) -> str:
    """The message on one line; a spec error keeps its caret display below it."""
    if isinstance(e, SpecError):
        return str(e)
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())


def _one_line_os(e: OSError) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if text.startswith(type(e).__name__) else f"{type(e).__name__}: {text}"


def _doing(e: BaseException) -> str:
    """What raised `e`: the innermost of lmcore's functions on its traceback
    (`lmcore.model.reading.read_tensors ran`), else the innermost function."""
    import traceback

    frames = list(traceback.walk_tb(e.__traceback__))
    ours = [f for f, _ in frames if f.f_globals.get("__name__", "").startswith("lmcore")]
    frame = (ours or [f for f, _ in frames] or [None])[-1]
    if frame is None:
        return "running the command"
    module = str(frame.f_globals.get("__name__", "?"))
    return f"{module}.{frame.f_code.co_name} ran"


def _is_stdout_error(e: OSError) -> bool:
    """Whether `e` (about no file) is what writing stdout raises: a full disk, an I/O error, a
    closed file."""
    return e.errno in _WRITE_ERRORS


_WRITE_ERRORS = {errno.ENOSPC, errno.EIO, errno.EBADF, errno.EFBIG, errno.EPIPE}
_FULL = dict.fromkeys(
    (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG),
    "; nothing was replaced: free space there, or write elsewhere",
)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# ASCII stand-ins for the non-ASCII characters lmcore prints, for terminals that cannot show them.
_ASCII = {
    "×": "x", "·": "*", "→": "->", "≤": "<=", "≥": ">=", "²": "^2", "³": "^3", "…": "...",
    "—": "-", "–": "-", "−": "-", "σ": "sigma", "√": "sqrt", "≈": "~", "ᵀ": "^T", "θ": "theta",
    "‘": "'", "’": "'", "“": '"', "”": '"', "±": "+-",
}  # fmt: skip


def _ascii_stand_in(e: UnicodeError) -> tuple[str, int]:
    if not isinstance(e, UnicodeEncodeError):
        raise e
    text = e.object[e.start : e.end]
    return "".join(_ASCII.get(c, "?") for c in text), e.end


codecs.register_error("lmcore-ascii", _ascii_stand_in)


@contextlib.contextmanager
def _ascii_fallback() -> Iterator[None]:
    """While a command runs, characters stdout/stderr cannot encode get ASCII stand-ins."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            with contextlib.suppress(OSError, ValueError):
                changed.append((stream, stream.errors))
                stream.reconfigure(errors="lmcore-ascii")
    try:
        yield
    finally:
        for stream, errors in changed:
            with contextlib.suppress(OSError, ValueError):
                stream.reconfigure(errors=errors)


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit status 2."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: error: {message} (see {self.prog} --help)")
        raise SystemExit(2)


class _Version(argparse.Action):
    """`lmcore --version`: torch's version is read from its installed metadata, not imported."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from lmcore.version import versions

        found = versions("torch", "python")
        print(f"lmcore {found['lmcore']} (torch {found['torch']}, Python {found['python']})")
        raise SystemExit(0)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lmcore",
        description="Build decoder-only transformer LMs from spec strings and plugin components.",
        epilog='Spec example: "tinystories, pos=nope, norm=rmsnorm(eps=1e-6)". '
        "See docs/spec.md for the grammar.",
    )
    parser.add_argument(
        "--version", action=_Version, help="print lmcore's, torch's and Python's versions and exit"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
