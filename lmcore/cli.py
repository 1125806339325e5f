"""The `lmcore` console script.

lmcore build SPEC           build a model; print its canonical spec and parameter count
lmcore describe SPEC        parameters, FLOPs and memory by component, before any weight exists
lmcore run SPEC             forward+backward steps on random tokens: tokens/s and peak memory
lmcore plugins              list components, presets and plugins with provenance and status
lmcore convert              Hugging Face Llama directory <-> lmcore checkpoint
lmcore data prepare SRC...  train a BPE tokenizer and write token ids for training
lmcore train SPEC           train a model on prepared data: checkpoints, metrics, loss curve
lmcore sweep BASE --vary    train a baseline and its variants alike; compare them
lmcore compare RUN...       the comparison table and plot of existing runs
lmcore quickstart           train a small model on this Python's standard library (a minute)
lmcore generate SPEC|CKPT   write text (or token ids) from a prompt, streaming, with a KV cache

Wherever a SPEC is taken, a checkpoint path is too (a name ending in .safetensors, or a path with
a directory separator and no '='): its embedded spec is used, resolved against the plugins that
saved it.

Exit status: 0 done; 2 the input is wrong (spec, options, environment variables, plugins), with
a one-line message on stderr (plus the caret display for spec errors); 1 lmcore failed: a bug
(with a traceback), a check that `describe --measure` or `run` reports, or output that could
not be written; 130 interrupted (Ctrl-C). Output that the terminal's encoding cannot show
(e.g. `×` under PYTHONIOENCODING=ascii) is written with ASCII stand-ins.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import errno
import io
import json
import math
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from lmcore.components import KINDS
from lmcore.errors import LmcoreError, LmcoreWarning, SlowPluginWarning, SpecError

if TYPE_CHECKING:
    from lmcore.accounting import Description, TrainingMemory
    from lmcore.blueprint import Blueprint
    from lmcore.checkpoint import CheckpointInfo
    from lmcore.train import RunResult


class UsageError(LmcoreError, ValueError):
    """A command-line option does not fit the spec (e.g. --seq beyond context_length)."""


def main(argv: Sequence[str] | None = None) -> int:
    with _ascii_fallback(), warnings.catch_warnings():
        parser = _parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help, or a usage error already reported in one line
            return int(e.code or 0)
        prog = f"lmcore {args.command}"
        warnings.simplefilter("ignore", LmcoreWarning)  # `lmcore plugins` prints them itself
        warnings.simplefilter("always", SlowPluginWarning)  # ... but not a plugin still loading
        warnings.showwarning = lambda message, *_: _say(f"{prog}: warning: {message}")
        try:
            from lmcore.registry import guard_torch_import  # before any command imports torch

            for problem in guard_torch_import():
                _say(f"{prog}: warning: {problem}")
            code: int = args.func(args)
            sys.stdout.flush()  # a full disk or closed pipe shows here, not at exit
        except LmcoreError as e:
            _say(f"{prog}: error: {_one_line(e)}")
            return 2
        except KeyboardInterrupt:
            _say(f"{prog}: interrupted")
            return 130  # as a shell reports a process ended by SIGINT
        except BrokenPipeError:  # `lmcore plugins | head`
            _silence_stdout()
            return 0
        except OSError as e:
            if e.filename is not None:  # a path the command was given (--save, --out, ...)
                _say(f"{prog}: error: {e.filename}: {e.strerror or e}")
                return 2
            if not _is_stdout_error(e):
                raise
            _silence_stdout()
            _say(f"{prog}: error: cannot write the output: {e}")
            return 1
        return code


def _one_line(e: LmcoreError) -> str:
    """The message on one line; a spec error keeps its caret display below it."""
    if isinstance(e, SpecError):
        return str(e)
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _is_stdout_error(e: OSError) -> bool:
    """Whether `e` (about no file) is what writing stdout raises: a full disk, an I/O error, a
    closed file."""
    return e.errno in _WRITE_ERRORS


_WRITE_ERRORS = {errno.ENOSPC, errno.EIO, errno.EBADF, errno.EFBIG, errno.EPIPE}


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
        _say(f"{self.prog}: error: {message} (see {self.prog} --help)")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="lmcore",
        description="Build decoder-only transformer LMs from spec strings and plugin components.",
        epilog='Spec example: "tinystories, pos=nope, norm=rmsnorm(eps=1e-6)". '
        "See the README for the grammar.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    p = sub.add_parser(
        "build",
        help="build a model and print its canonical spec and size",
        description="Build a model from a spec (seeded weights) or a checkpoint (its weights), "
        "print its canonical spec and parameter count, and optionally save it.",
    )
    p.add_argument("spec", help=f'spec string, e.g. "tinystories, pos=nope"; {_OR_CHECKPOINT}')
    p.add_argument("--dtype", choices=DTYPES, help=_DTYPE_HELP)
    p.add_argument("--device", default="cpu", help="torch device (meta: no allocation)")
    p.add_argument(
        "--seed", type=_seed, default=0, help="seeds a spec's weights (0 .. 2**64-1; default: 0)"
    )
    p.add_argument(
        "--save", metavar="PATH", help="save the model to PATH (.safetensors) with its spec"
    )
    p.add_argument("--max-bytes", type=_byte_count, help=MAX_BYTES_HELP)
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser(
        "describe",
        help="parameters, FLOPs and memory by component (builds on the meta device only)",
        description="Account a spec before any weight exists: parameters and forward FLOPs by "
        "component with their shares, weight memory and a training-memory estimate (AdamW).",
    )
    p.add_argument(
        "spec",
        help=f'spec string, e.g. "gpt2-xl" or "tinystories, ffn=gelu"; {_OR_CHECKPOINT}, whose '
        "spec and provenance are shown",
    )
    p.add_argument("--seq", type=_positive, help="tokens per sequence (default: context_length)")
    p.add_argument("--batch", type=_positive, default=1, help="sequences per batch (default: 1)")
    p.add_argument("--dtype", choices=DTYPES, help=_DTYPE_HELP)
    p.add_argument(
        "--measure",
        action="store_true",
        help="measure activations with a forward on the meta device (about a second more) and "
        "check each component's declaration against it; exit 1 on a difference",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_describe)

    p = sub.add_parser(
        "run",
        help="forward+backward steps on random tokens; report tokens/s and peak memory",
        description="A smoke test for any spec: build the model, run forward+backward steps on "
        "random token ids (next-token cross-entropy, no weight update) and report throughput, "
        "peak memory and whether the gradient reached every parameter.",
    )
    p.add_argument(
        "spec",
        help=f'spec string, e.g. "tinystories"; {_OR_CHECKPOINT}, whose weights the steps '
        "start from",
    )
    p.add_argument(
        "--steps", type=_positive, default=10, help="forward+backward steps (default: 10)"
    )
    p.add_argument("--batch", type=_positive, default=2, help="sequences per step (default: 2)")
    p.add_argument(
        "--seq", type=_positive, help="tokens per sequence (default: min(128, context_length))"
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N"
    )
    p.add_argument("--dtype", choices=DTYPES, help=_DTYPE_HELP)
    p.add_argument(
        "--seed", type=_seed, default=0, help="seeds the weights and the tokens (0 .. 2**64-1)"
    )
    p.add_argument("--max-bytes", type=_byte_count, help=MAX_BYTES_HELP + " (weights and a step)")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("plugins", help="list components and presets with provenance and status")
    p.add_argument("--kind", choices=[*KINDS, "preset"])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_plugins)

    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face Llama directory to an lmcore checkpoint, or back",
        description="Convert between Hugging Face Llama model directories (config.json and "
        "safetensors weights, sharded or not) and lmcore checkpoints. Anything the target "
        "cannot express is refused, naming the field or component.",
    )
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from-hf", nargs=2, metavar=("DIR", "OUT.safetensors"), help="Llama directory -> lmcore"
    )
    way.add_argument("--to-hf", nargs=2, metavar=("CKPT", "DIR"), help="lmcore -> Llama directory")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="--from-hf: store the weights in this dtype (default: as is)",
    )
    p.add_argument(
        "--ignore-field",
        action="append",
        default=[],
        metavar="NAME",
        help="--from-hf: a config.json field lmcore does not know that you know does not change "
        "the model (repeatable); unknown fields are refused otherwise",
    )
    p.set_defaults(func=_cmd_convert)

    _add_data_parser(sub)
    _add_train_parsers(sub)
    _add_generate_parser(sub)
    return parser


DTYPES = ("bfloat16", "float16", "float32")
MAX_BYTES_HELP = (
    "refuse a model (and step) needing more memory than this, e.g. 8GiB or 500MB "
    "(default: the memory available on the device)"
)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50}  # fmt: skip
_OR_CHECKPOINT = "or a checkpoint path (.safetensors)"
_DTYPE_HELP = "default: float32, or a checkpoint's own dtype"


def _source(args: argparse.Namespace) -> tuple[Blueprint, CheckpointInfo | None]:
    """The blueprint of a command's SPEC argument, a spec string or a checkpoint path (with the
    checkpoint's info)."""
    from lmcore.checkpoint import spec_or_checkpoint

    with _checkpoint_warnings(args.command):
        return spec_or_checkpoint(args.spec)


@contextlib.contextmanager
def _checkpoint_warnings(command: str) -> Iterator[None]:
    """Print a checkpoint's provenance warnings as `lmcore CMD: warning: ...`; other warnings
    pass through as before."""
    from lmcore.errors import CheckpointWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        yield
    for w in caught:
        if issubclass(w.category, CheckpointWarning):
            print(f"lmcore {command}: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


def _dtype(args: argparse.Namespace, info: CheckpointInfo | None) -> Any:
    """`--dtype` as a torch dtype; by default a checkpoint's own, else float32."""
    import torch

    if args.dtype is not None:
        return getattr(torch, args.dtype)
    return info.torch_dtype if info is not None else torch.float32


def _positive(text: str) -> int:
    value = int(text) if re.fullmatch(r"\s*\+?\d{1,19}\s*", text) else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seed(text: str) -> int:
    value = int(text) if re.fullmatch(r"\s*\+?\d{1,20}\s*", text) else -1
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"expected an integer in 0 .. 2**64-1, got {text!r}")
    return value


def _byte_count(text: str) -> int:
    m = re.fullmatch(r"\s*(\d{1,20}(?:\.\d{1,10})?)\s*([A-Za-z]*)\s*", text)
    unit = m[2].upper() if m else ""
    if m is None or unit not in _UNITS or float(m[1]) * _UNITS[unit] < 1:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes such as 8GiB, 500MB or 1000000, got {text!r}"
        )
    return int(float(m[1]) * _UNITS[unit]) if "." in m[1] else int(m[1]) * _UNITS[unit]


def _cmd_build(args: argparse.Namespace) -> int:
    import torch

    from lmcore.checkpoint import build_from_checkpoint, save
    from lmcore.inputs import check_device
    from lmcore.model import build_model

    bp, info = _source(args)
    dtype = _dtype(args, info)
    device = check_device(args.device)
    if info is not None and device.type != "meta":
        model = build_from_checkpoint(
            info, bp, device=device, dtype=dtype, max_bytes=args.max_bytes
        )
    else:
        torch.manual_seed(args.seed)
        model = build_model(bp, device=device, dtype=dtype, max_bytes=args.max_bytes)
    n = sum(p.numel() for p in model.parameters())
    print(model.spec)
    print(f"parameters: {n:,}")
    if args.save is not None:
        path = save(model, args.save)
        print(f"saved: {path} ({_bytes(path.stat().st_size)}, {str(dtype).removeprefix('torch.')})")
    return 0


def _check_seq(args: argparse.Namespace, context_length: int) -> None:
    if args.seq is not None and args.seq > context_length:
        raise UsageError(
            f"--seq {args.seq} exceeds context_length={context_length} of this spec; "
            f"use --seq {context_length} or less, or raise the context in the spec: "
            f'"{args.spec}, context_length={args.seq}"'
        )


def _cmd_describe(args: argparse.Namespace) -> int:

    from lmcore.accounting import describe

    bp, info = _source(args)
    _check_seq(args, bp.spec.context_length)
    found = describe(
        bp,
        batch=args.batch,
        seq_len=args.seq,
        dtype=_dtype(args, info),
        measure=args.measure,
    )
    if args.json:
        data = describe_json(found)
        print(
            json.dumps(
                data if info is None else {"checkpoint": checkpoint_json(info), **data}, indent=2
            )
        )
    else:
        print(
            "\n".join([*([] if info is None else checkpoint_lines(info)), *describe_lines(found)])
        )
    if found.mismatches:
        print(
            "lmcore describe: error: declared activations differ from the measurement:\n  "
            + "\n  ".join(found.mismatches),
            file=sys.stderr,
        )
        return 1
    return 0


def checkpoint_lines(info: CheckpointInfo) -> list[str]:
    """What a checkpoint says about itself: file, format, versions, and per component the
    distribution, version and entry point that provided it when it was saved."""
    lines = [
        f"checkpoint: {info.path} ({_bytes(info.size)}, {len(info.tensors)} tensors, {info.dtype}; "
        f"lmcore checkpoint format {info.format_version}, written by lmcore "
        f"{info.lmcore_version} with torch {info.torch_version})",
    ]
    width = max(len(c.name) for c in info.components.values())
    for kind, saved in info.components.items():
        lines.append(f"  {kind:<4}  {saved.name:<{width}}  {saved}")
    for alias, stored in info.tied.items():
        lines.append(f"  tied: {alias} is stored once, as {stored}")
    for key, value in info.metadata.items():
        shown = value if len(value) <= 60 else value[:57] + "..."
        lines.append(f"  metadata: {key} = {shown}")
    return [*lines, ""]


def checkpoint_json(info: CheckpointInfo) -> dict[str, Any]:
    """`lmcore describe CKPT --json`'s "checkpoint" entry."""
    return {
        "path": str(info.path),
        "format_version": info.format_version,
        "spec": info.spec,
        "bytes": info.size,
        "tensors": len(info.tensors),
        "dtype": info.dtype,
        "lmcore_version": info.lmcore_version,
        "torch_version": info.torch_version,
        "components": {
            kind: {
                "name": c.name,
                "dist": c.dist,
                "version": c.version,
                "plugin": c.plugin,
                "module": c.module,
            }
            for kind, c in info.components.items()
        },
        "tied": dict(info.tied),
        "metadata": dict(info.metadata),
    }


def describe_json(found: Description) -> dict[str, Any]:
    """`lmcore describe --json`: every row, the totals, the FLOPs by part and the memory."""
    acc, mem = found.accounting, found.memory
    return {
        "spec": str(acc.spec),
        "batch": acc.batch,
        "seq_len": acc.seq_len,
        "dtype": mem.dtype,
        "rows": [
            {
                "name": r.name,
                "part": r.part,
                "module": r.module,
                "count": r.count,
                "params_each": r.params_each,
                "params": r.params,
                "params_share": acc.params_share(r),
                "flops_each": r.flops_each,
                "flops": r.flops,
                "flops_share": acc.flops_share(r),
                "activations_declared": r.activations,
            }
            for r in acc.rows
        ],
        "per_layer": {"params": acc.layer_params, "flops": acc.layer_flops},
        "total": {"params": acc.params, "flops": acc.flops},
        "flops_by_part": {
            part: {"flops": n, "share": n / acc.flops if acc.flops else 0.0}
            for part, n in acc.flops_by_part().items()
        },
        "memory": {
            "weights": mem.weights,
            "gradients": mem.gradients,
            "optimizer": mem.optimizer,
            "buffers": mem.buffers,
            "activations": mem.activations,
            "activations_source": mem.activations_source,
            "total": mem.total,
            "note": mem.note,
        },
        "activations_by_part": mem.activations_by_part,
        "mismatches": list(found.mismatches),
    }


def describe_lines(found: Description) -> list[str]:
    """`lmcore describe` as text: the spec, one row per module, the FLOPs by part, memory."""

    acc, mem = found.accounting, found.memory
    table = [("row", "module", "count", "parameters", "share", "forward FLOPs", "share")]
    for r in acc.rows:
        table.append((
            r.name, r.module, str(r.count), f"{r.params:,}", _pct(acc.params_share(r)),
            f"{r.flops:,}", _pct(acc.flops_share(r)),
        ))  # fmt: skip
    table.append(("per layer", "", "", f"{acc.layer_params:,}", "", f"{acc.layer_flops:,}", ""))
    table.append(("total", "", "", f"{acc.params:,}", _pct(1.0), f"{acc.flops:,}", _pct(1.0)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    left = (True, True, False, False, False, False, False)
    lines = [
        f"spec: {acc.spec}",
        f"input: batch {acc.batch} × seq {acc.seq_len} tokens, {mem.dtype}",
        "",
    ]
    for n, row in enumerate(table):
        if n == len(table) - 2:
            lines.append("")
        cells = [
            c.ljust(w) if lft else c.rjust(w) for c, w, lft in zip(row, widths, left, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    by_part = acc.flops_by_part()
    lines += ["", f"forward FLOPs by part (total {_flops(acc.flops)}):"]
    width = max(len(part) for part in by_part)
    for part, n in by_part.items():
        lines.append(
            f"  {part:<{width}}  {_flops(n):>13}  {_pct(n / acc.flops if acc.flops else 0):>6}"
        )
    size = mem.weights // acc.params if acc.params else 0
    lines += [
        "",
        f"weights: {_bytes(mem.weights)} ({acc.params:,} parameters × {size} bytes, {mem.dtype})",
        "",
        f"training memory estimate (AdamW, {mem.dtype}, batch {acc.batch} × seq {acc.seq_len}):",
    ]
    items: list[tuple[str, int | None, str]] = [
        ("weights", mem.weights, ""),
        ("gradients", mem.gradients, ""),
        ("AdamW moments", mem.optimizer, "two float32 moments per parameter"),
        ("activations", mem.activations, _activations_note(mem)),
        ("buffers", mem.buffers, "non-persistent tables, e.g. RoPE cos/sin"),
        ("total", mem.total, "" if mem.activations is not None else "without activations"),
    ]
    for label, amount, why in items:
        shown = "?" if amount is None else _bytes(amount)
        lines.append(f"  {label:<13}  {shown:>10}  {why}".rstrip())
    if mem.activations:
        lines += ["", f"activations by part (total {_bytes(mem.activations)}):"]
        width = max(len(part) for part in mem.activations_by_part)
        for part, n in mem.activations_by_part.items():
            share = _pct(n / mem.activations)
            lines.append(f"  {part:<{width}}  {_bytes(n):>10}  {share:>6}")
    return lines


def _activations_note(mem: TrainingMemory) -> str:
    what = "saved for backward by forward + loss"
    why = f" ({mem.note})" if mem.note else ""
    if mem.activations_source == "declared":
        return f"{what}, declared by the components{why}"
    if mem.activations_source == "measured":
        return f"{what}, measured on the meta device{why}"
    return f"unknown: {mem.note}"


def _bytes(n: int) -> str:
    """Binary prefixes, as memory is sized: 7.92 GiB (`lmcore.accounting.format_bytes`)."""
    from lmcore.accounting import format_bytes

    return format_bytes(n)


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def _flops(n: int) -> str:
    """Decimal prefixes, as FLOP counts are usually quoted: 4.51 TFLOPs."""
    scales = (("PFLOPs", 1e15), ("TFLOPs", 1e12), ("GFLOPs", 1e9), ("MFLOPs", 1e6), ("kFLOPs", 1e3))
    for unit, scale in scales:
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:,} FLOPs"


def _cmd_run(args: argparse.Namespace) -> int:

    from lmcore.train import ProgressBar, run_steps

    bp, info = _source(args)
    _check_seq(args, bp.spec.context_length)
    result = run_steps(
        bp,
        steps=args.steps,
        batch=args.batch,
        seq_len=args.seq,
        device=args.device,
        dtype=_dtype(args, info),
        seed=args.seed,
        progress=ProgressBar(sys.stderr),
        weights=info,
        max_bytes=args.max_bytes,
    )
    print("\n".join(run_lines(result)))
    bad_loss = [i + 1 for i, x in enumerate(result.losses) if not math.isfinite(x)]
    if bad_loss:
        print(
            "lmcore run: error: the loss is not finite at step(s) "
            f"{', '.join(map(str, bad_loss))}; "
            "check the components' numerics (with bfloat16, try --dtype float32)",
            file=sys.stderr,
        )
    if result.gradient_problems:
        print(
            f"lmcore run: error: {len(result.gradient_problems)} parameter tensor(s) got no usable "
            f"gradient ({'; '.join(result.gradient_problems)}); a component holds parameters its "
            "forward does not use, or its backward is broken",
            file=sys.stderr,
        )
    return 0 if result.ok else 1


def run_lines(r: RunResult) -> list[str]:
    """`lmcore run`'s report."""

    tokens = r.steps * r.batch * r.seq_len
    timed = "the one step" if r.steps == 1 else f"steps 2-{r.steps}; step 1 warms up"
    peak = "unknown" if r.peak_memory is None else _bytes(r.peak_memory)
    if r.gradient_problems:
        grads = f"{len(r.gradient_problems)} parameter(s) without a usable gradient: " + "; ".join(
            r.gradient_problems
        )
    else:
        grads = f"all {r.param_tensors} parameter tensors received a finite, non-zero gradient"
    return [
        f"spec: {r.spec}",
        f"model: {r.params:,} parameters, {r.dtype} on {r.device}",
        f"run: {r.steps} steps × batch {r.batch} × seq {r.seq_len} = {tokens:,} random tokens, "
        "forward + backward of next-token cross-entropy, no weight update",
        f"loss: first {r.losses[0]:.4f}, last {r.losses[-1]:.4f} "
        f"(ln vocab_size = {math.log(r.spec.vocab_size):.4f})",
        f"throughput: {r.tokens_per_second:,.0f} tokens/s ({timed})",
        f"peak memory: {peak} ({r.peak_memory_kind})",
        f"gradients: {grads}",
    ]


def plugin_rows(kind: str | None = None) -> list[dict[str, Any]]:
    """One row per component, preset and unavailable plugin, as `lmcore plugins` shows them."""
    from lmcore.registry import get_registry

    registry = get_registry()
    rows: list[dict[str, Any]] = []
    if kind != "preset":
        for e in registry.entries(kind):
            rows.append(
                _row(e.kind, e.name, e.provenance, e.status, e.component.help)
                | {"args": [_arg_json(a) for a in e.component.args]}
            )
    if kind in (None, "preset"):
        for p in registry.preset_entries():
            rows.append(
                _row("preset", p.name, p.provenance, p.status, p.preset.help) | {"args": []}
            )
    for r in registry.plugins():
        if r.status != "ok":  # its kinds are unknown, so it shows under every filter
            rows.append(_row("-", r.name, r.provenance, r.status, r.reason) | {"args": []})
        elif not r.components and not r.presets:  # loaded, yet nothing to show for it
            note = "loaded, but declares no components or presets"
            rows.append(_row("-", r.name, r.provenance, "empty", note) | {"args": []})
    order = {kind: n for n, kind in enumerate((*KINDS, "preset", "-"))}
    rows.sort(key=lambda r: (order[r["kind"]], r["name"], r["dist"] or ""))
    return rows


def _row(kind: str, name: str, prov: Any, status: str, note: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "dist": prov.dist,
        "version": prov.version,
        "plugin": prov.plugin,
        "module": prov.module,
        "status": status,
        "note": note,
    }


def _arg_json(a: Any) -> dict[str, Any]:
    return {
        "name": a.name,
        "type": a.type.__name__,
        "default": None if a.required else a.default,
        "required": a.required,
        "help": a.help,
    }


def _cmd_plugins(args: argparse.Namespace) -> int:
    from lmcore.components import format_qualified, format_scalar
    from lmcore.registry import get_registry

    rows = plugin_rows(args.kind)
    problems = get_registry().problems
    if args.json:
        print(json.dumps({"components": rows, "problems": problems}, indent=2))
        return 0
    table = [("KIND", "NAME", "DIST", "VERSION", "STATUS", "ARGS / REASON")]
    for r in rows:
        detail = ", ".join(
            f"{a['name']}: {a['type']} = "
            + ("required" if a["required"] else format_scalar(a["default"]))
            for a in r["args"]
        )
        if r["status"] in ("failed", "disabled", "empty"):
            detail = r["note"]
        elif r["status"] == "shadowed":
            typed = format_qualified(r["dist"] or r["plugin"], r["name"])
            detail = f"{detail}  (ambiguous: write {typed})".strip()
        table.append(
            (
                r["kind"],
                r["name"],
                r["dist"] or "(in-process)",
                r["version"] or "-",
                r["status"],
                detail,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        cells = [cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)]
        print("  ".join([*cells, row[5]]).rstrip())
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    import torch

    from lmcore import hf
    from lmcore.checkpoint import read_info

    with _checkpoint_warnings(args.command):
        if args.from_hf is not None:
            directory, out = args.from_hf
            dtype = None if args.dtype is None else getattr(torch, args.dtype)
            written = hf.convert_from_hf(directory, out, dtype=dtype, ignore=args.ignore_field)
            info = read_info(written)
            print(f"spec: {info.spec}")
            print(f"wrote: {info.path} ({_bytes(info.size)}, {info.dtype}, lmcore checkpoint)")
        else:
            if args.dtype is not None or args.ignore_field:
                raise UsageError(
                    "--dtype and --ignore-field apply to --from-hf only; --to-hf writes the "
                    "checkpoint's dtype and a config of its own"
                )
            checkpoint, directory = args.to_hf
            written = hf.convert_to_hf(checkpoint, directory)
            print(f"spec: {read_info(checkpoint).spec}")
            print(
                f"wrote: {written / 'config.json'} and {written / hf.WEIGHTS} "
                f"({hf.ARCHITECTURE}; transformers.{hf.ARCHITECTURE}.from_pretrained loads it)"
            )
    return 0


def _add_data_parser(sub: Any) -> None:
    from lmcore.data.meta import DEFAULT_SPLIT_BLOCK, DEFAULT_VAL_FRACTION, DEFAULT_VOCAB_SIZE
    from lmcore.data.sources import DEFAULT_EXTENSIONS

    data = sub.add_parser("data", help="prepare token data for training")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND")
    p = data_sub.add_parser(
        "prepare",
        help="train a byte-level BPE tokenizer and write train.bin, val.bin",
        description="Train a byte-level BPE tokenizer (Hugging Face tokenizers) on text files "
        "and write DIR/train.bin and DIR/val.bin (flat uint16 token ids, uint32 for a "
        "vocabulary over 65,536), DIR/tokenizer.json and DIR/meta.json. Each file is a "
        "document followed by <|endoftext|>; the literal text <|endoftext|> inside a file is "
        "that token too.",
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="text files or directories")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument(
        "--vocab-size",
        type=int,
        metavar="N",
        help=f"tokens of the trained BPE, at least 257 (default: {DEFAULT_VOCAB_SIZE})",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=DEFAULT_VAL_FRACTION,
        metavar="F",
        help=f"share of the tokens for val.bin, in (0, 1) (default: {DEFAULT_VAL_FRACTION})",
    )
    p.add_argument(
        "--tokenizer", metavar="FILE", help="reuse this tokenizer.json instead of training one"
    )
    p.add_argument("--force", action="store_true", help="replace data already in DIR")
    p.add_argument(
        "--ext",
        action="append",
        metavar="EXT",
        help="read files with this extension from directories; repeatable "
        f"(default: {' '.join(DEFAULT_EXTENSIONS)})",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip paths under a directory whose relative path or any part matches; "
        "repeatable (e.g. --exclude test --exclude '*.min.js')",
    )
    p.add_argument(
        "--skip-undecodable",
        action="store_true",
        help="leave out files that are not UTF-8 (listed in meta.json) instead of failing",
    )
    p.add_argument(
        "--split-block",
        type=int,
        default=DEFAULT_SPLIT_BLOCK,
        metavar="N",
        help="longest run of tokens assigned to one split; longer documents are cut "
        f"(default: {DEFAULT_SPLIT_BLOCK})",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=1,
        metavar="N",
        help="fail unless each split holds a window of N+1 tokens (default: 1)",
    )
    p.set_defaults(func=_cmd_data_prepare, command="data prepare")


def _cmd_data_prepare(args: argparse.Namespace) -> int:
    from lmcore.data.prepare import prepare
    from lmcore.data.sources import DEFAULT_EXTENSIONS

    result = prepare(
        args.sources,
        args.out,
        vocab_size=args.vocab_size,
        val_fraction=args.val_fraction,
        tokenizer=args.tokenizer,
        force=args.force,
        extensions=args.ext or DEFAULT_EXTENSIONS,
        exclude=args.exclude,
        split_block=args.split_block,
        context_length=args.context_length,
        skip_undecodable=args.skip_undecodable,
    )
    print("\n".join(prepare_lines(result)))
    return 0


def prepare_lines(r: Any) -> list[str]:
    """`lmcore data prepare`'s summary of a `PrepareResult`."""
    m = r.meta
    total = m.tokens
    sources = f"{len(m.sources)} source{'s' if len(m.sources) != 1 else ''}"
    skipped = (
        f"; skipped {len(m.skipped)} not UTF-8 (meta.json lists them), e.g. {m.skipped[0]}"
        if m.skipped
        else ""
    )
    made = (
        f"trained in {r.tokenizer_seconds:.1f} s"
        if m.tokenizer_from is None
        else f"reused from {m.tokenizer_from}"
    )
    splits = ", ".join(
        f"{name} {s.tokens:,} ({100 * s.tokens / total:.1f}%, {s.documents:,} documents)"
        for name, s in m.splits.items()
    )
    return [
        f"data: {r.out_dir}: train.bin, val.bin ({m.dtype}), tokenizer.json, meta.json",
        f"text: {m.files:,} files, {m.bytes:,} bytes of UTF-8 from {sources}{skipped}",
        f"tokenizer: byte-level BPE, {m.vocab_size:,} tokens ({m.eot_token} = {m.eot_id}), {made}",
        f"tokens: {splits}",
        f"time: {r.seconds:.1f} s in all; encoding {total:,} tokens took "
        f"{r.encode_seconds:.1f} s, {r.tokens_per_second:,.0f} tokens/s",
    ]


# ------------------------------------------------------------------------------ training


def _add_train_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on prepared data (checkpoints, metrics, loss curve)",
        description="Train SPEC (or a checkpoint's model, from its weights) on the token data "
        "of `lmcore data prepare` into the run directory RUN: AdamW with a cosine schedule "
        "and warmup, gradient clipping, evaluation on val.bin, checkpoints (resumable bit for "
        "bit), metrics.jsonl and loss.png. Ctrl-C saves a checkpoint and stops; "
        "`lmcore train --resume RUN` continues.",
    )
    p.add_argument(
        "spec",
        nargs="?",
        help=f'spec string, e.g. "tinystories, vocab_size=2048"; {_OR_CHECKPOINT}',
    )
    p.add_argument("--data", metavar="DIR", help="prepared data (lmcore data prepare)")
    p.add_argument("--out", metavar="RUN", help="the new run directory")
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the run in RUN from its newest checkpoint (no SPEC; --steps/--tokens "
        "may extend it)",
    )
    _add_budget_options(p)
    _add_parallel_options(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "sweep",
        help="train a baseline and its variants with the same budget; compare them",
        description="Train BASE and, for each --vary, BASE with those key=value items "
        "replaced, one after another with the same options, seed and data order, into "
        "SWEEP/<name>-<hash>; write SWEEP/compare.md, compare.json and val_loss.png. A run "
        "that diverges is reported and the sweep goes on; running the same command again "
        "continues an interrupted sweep.",
    )
    p.add_argument("base", metavar="BASE", help='the baseline spec, e.g. "tinystories"')
    p.add_argument(
        "--vary",
        action="append",
        required=True,
        metavar="ITEMS",
        help='a variant: key=value items replacing the base\'s, e.g. "norm=none" or '
        '"pos=nope, num_layers=6"; repeatable',
    )
    p.add_argument("--data", required=True, metavar="DIR", help="prepared data")
    p.add_argument("--out", required=True, metavar="SWEEP", help="the sweep's directory")
    _add_budget_options(p)
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser(
        "compare",
        help="compare runs: final losses, throughput, validation curves",
        description="Print a Markdown table of existing runs (parameters, final train and "
        "validation loss, the difference to the first run, tokens/s, wall time, status); "
        "with --out also write compare.md, compare.json and val_loss.png there.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--out", metavar="DIR", help="write the table, its JSON and the plot here")
    p.set_defaults(func=_cmd_compare)

    from lmcore.quickstart import QUICKSTART_DATA, QUICKSTART_RUN, QUICKSTART_STEPS

    p = sub.add_parser(
        "quickstart",
        help="train a small model on this Python's standard library, in about a minute",
        description="Tokenise the running Python's standard library (once) and train a small "
        "model on it, printing the validation loss as it falls; it prints the two ordinary "
        "commands (data prepare, train) that do the same.",
    )
    p.add_argument(
        "--steps", type=_positive, default=QUICKSTART_STEPS, help=f"default: {QUICKSTART_STEPS}"
    )
    p.add_argument(
        "--data", default=str(QUICKSTART_DATA), metavar="DIR", help="default: %(default)s"
    )
    p.add_argument(
        "--out",
        metavar="RUN",
        help=f"default: {QUICKSTART_RUN}, or the next free {QUICKSTART_RUN}-N",
    )
    p.add_argument("--device", default="auto", help="default: auto (cuda if available, else cpu)")
    p.set_defaults(func=_cmd_quickstart)


def _add_parallel_options(p: argparse.ArgumentParser) -> None:
    """`--parallel ddp|fsdp` under torchrun (lmcore.parallel)."""
    p.add_argument(
        "--parallel",
        choices=("ddp", "fsdp"),
        help="under torchrun (torchrun --nproc-per-node N -m lmcore train ...): ddp replicates "
        "the model on every process, fsdp shards weights, gradients and AdamW state over them; "
        "each process trains on its own rows of every batch",
    )
    p.add_argument(
        "--fsdp-bf16",
        action="store_const",
        const="bfloat16",
        dest="mixed_precision",
        help="with --parallel fsdp: compute with bfloat16 copies of the weights and reduce "
        "gradients in float32 (the shards and AdamW state keep --dtype)",
    )


def _add_budget_options(p: argparse.ArgumentParser) -> None:
    """The training options of `train` and `sweep`; each defaults to TrainConfig's."""
    from lmcore.train_config import AUTOCAST, DTYPES, TrainConfig

    d = TrainConfig()
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--steps", type=_positive, metavar="N", help=f"optimizer steps (default: {d.steps})"
    )
    budget.add_argument(
        "--tokens",
        type=_positive,
        metavar="N",
        help="train on N tokens instead: steps = ceil(N / (batch size × context length))",
    )
    options: list[tuple[str, Any, str, str]] = [
        ("--batch-size", _positive, "B", f"sequences per step (default: {d.batch_size})"),
        ("--lr", float, "LR", f"peak learning rate (default: {d.lr:g})"),
        ("--min-lr", float, "LR", "the cosine schedule's floor (default: lr / 10)"),
        ("--warmup", int, "N", "linear warmup steps (default: 10%% of the steps)"),
        ("--weight-decay", float, "WD", f"AdamW's, on matrices only (default: {d.weight_decay:g})"),
        ("--grad-clip", float, "NORM", f"global gradient norm; 0: off (default: {d.grad_clip:g})"),
        ("--eval-every", int, "N", f"steps between evaluations; 0: only first and last "
                                   f"(default: {d.eval_every})"),
        ("--eval-batches", _positive, "N", f"fixed validation batches (default: {d.eval_batches})"),
        ("--log-every", _positive, "N", f"steps per metrics record (default: {d.log_every})"),
        ("--save-every", int, "N", f"steps between checkpoints; 0: only at the end "
                                   f"(default: {d.save_every})"),
        ("--keep", int, "N", f"newest checkpoints kept; 0: all (default: {d.keep})"),
        ("--seed", _seed, "N", f"initial weights and batch order (default: {d.seed})"),
        ("--device", str, "DEVICE", f"auto (cuda if available, else cpu), cpu, cuda:N "
                                    f"(default: {d.device})"),
    ]  # fmt: skip
    for flag, kind, metavar, text in options:
        p.add_argument(flag, type=kind, metavar=metavar, help=text)
    p.add_argument(
        "--betas",
        type=float,
        nargs=2,
        metavar=("B1", "B2"),
        help=f"AdamW's betas (default: {d.betas[0]} {d.betas[1]})",
    )
    p.add_argument(
        "--dtype", choices=DTYPES, help="parameter dtype (default: float32, or a checkpoint's)"
    )
    p.add_argument(
        "--bf16",
        action="store_const",
        const=AUTOCAST[0],
        dest="autocast",
        help="run the forward under bfloat16 autocast (parameters stay in --dtype)",
    )
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")


_CONFIG_KEYS = (
    "steps", "tokens", "batch_size", "lr", "min_lr", "warmup", "weight_decay", "grad_clip",
    "eval_every", "eval_batches", "log_every", "save_every", "keep", "seed", "device", "betas",
    "dtype", "autocast", "compile",
)  # fmt: skip


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The training options given on the command line, as TrainConfig fields."""
    given = {k: getattr(args, k) for k in _CONFIG_KEYS if getattr(args, k, None) is not None}
    if "betas" in given:
        given["betas"] = tuple(given["betas"])
    return given


def _config(args: argparse.Namespace) -> Any:
    from lmcore.train_config import TrainConfig

    given = _given(args)
    if given.get("grad_clip") == 0:
        given["grad_clip"] = None
    return TrainConfig(**given)


def _exit_code(status: str, reason: str | None) -> int:
    """0 done; 1 diverged; 128 + the signal when stopped by one (130 Ctrl-C, 143 SIGTERM)."""
    if status == "done":
        return 0
    if status == "interrupted" and reason in ("SIGINT", "SIGTERM"):
        import signal

        return 128 + int(signal.Signals[reason])
    return 1


def _cmd_train(args: argparse.Namespace) -> int:
    from lmcore.parallel import distributed  # one process, or torchrun's group

    with distributed(args.parallel, mixed_precision=args.mixed_precision) as parallel:
        if parallel.world_size > 1 and parallel.is_writer:
            print(f"parallel: {parallel!r}")
        return _train(args, parallel)


def _train(args: argparse.Namespace, parallel: Any) -> int:
    from lmcore.trainer import resume, train

    if args.resume is not None:
        if args.spec is not None or args.out is not None:
            raise UsageError(
                f"--resume {args.resume} continues that run in its own directory: give neither "
                "SPEC nor --out with it"
            )
        changes = _given(args)
        result = resume(args.resume, data=args.data, parallel=parallel, **changes)
        return _exit_code(result.status, result.reason)
    if args.spec is None:
        raise UsageError(
            "give a SPEC (or checkpoint) to train, e.g. lmcore train cs336-tiny --data DIR "
            "--out RUN, or --resume RUN to continue a run"
        )
    missing = [flag for flag, value in (("--data DIR", args.data), ("--out RUN", args.out))
               if value is None]  # fmt: skip
    if missing:
        raise UsageError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} needed to train "
            f"{args.spec!r}: --data names prepared data (lmcore data prepare), --out the new "
            "run directory"
        )
    bp, info = _source(args)
    result = train(bp, args.data, args.out, _config(args), init=info, parallel=parallel)
    return _exit_code(result.status, result.reason)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from lmcore.checkpoint import is_checkpoint_path
    from lmcore.sweep import sweep, table_markdown

    if is_checkpoint_path(args.base):
        raise UsageError(
            f"BASE {args.base!r} looks like a checkpoint path; a sweep trains every model from "
            "the start: give a spec (`lmcore describe CKPT` shows a checkpoint's spec)"
        )
    result = sweep(args.base, args.vary, args.data, args.out, _config(args))
    md, js, png = result.files
    print()
    print(table_markdown(result.rows), end="")
    print(f"\ntable: {md} (and {js.name}), validation curves: {png}")
    if result.interrupted is not None:
        print("interrupted; run the same command again to continue the sweep")
        return _exit_code("interrupted", result.interrupted)
    for row in result.failed:
        print(f"lmcore sweep: error: {row.label}: {row.error}", file=sys.stderr)
    return 1 if result.failed else 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from lmcore.sweep import compare_runs, table_markdown, write_comparison

    rows = compare_runs(args.runs)
    print(table_markdown(rows), end="")
    if args.out is not None:
        md, js, png = write_comparison(rows, args.out, f"{len(rows)} runs")
        print(f"\ntable: {md} (and {js.name}), validation curves: {png}")
    return 0


def _cmd_quickstart(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmcore.quickstart import quickstart

    result = quickstart(
        data=Path(args.data),
        out=None if args.out is None else Path(args.out),
        steps=args.steps,
        device=args.device,
    )
    return _exit_code(result.status, result.reason)


# ------------------------------------------------------------------------------ generate


def _add_generate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="write text (or token ids) after a prompt, streaming, with a KV cache",
        description="Generate from a model: a checkpoint (its weights and the tokenizer saved "
        "with it or its run) or a spec (seeded random weights). New text streams to stdout as "
        "it is produced; tokens/s go to stderr. Sampling: --temperature 0 is greedy; "
        "--top-k and --top-p cut the distribution first.",
    )
    p.add_argument(
        "spec",
        metavar="SPEC|CHECKPOINT",
        help=f"spec string (random weights), {_OR_CHECKPOINT}, a checkpoint directory (holding "
        "model.safetensors) or a run directory (its latest checkpoint)",
    )
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt (needs a tokenizer)")
    prompt.add_argument(
        "--prompt-ids", metavar="1,2,3", type=_ids, help="token ids, comma-separated"
    )
    p.add_argument(
        "--max-new-tokens",
        type=_positive,
        metavar="N",
        help="tokens to generate (default: as many as fit in the context, at most 256)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default: 1.0)")
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="keep the most likely tokens making up this probability (default: 1.0, all)",
    )
    p.add_argument("--top-k", type=_positive, help="keep only the K most likely tokens")
    p.add_argument(
        "--stop-token",
        type=int,
        metavar="ID",
        help="end at this token id (default: the tokenizer's <|endoftext|>, if it has one)",
    )
    p.add_argument(
        "--seed",
        type=_seed,
        help="seeds sampling (and a spec's random weights; default: unseeded sampling)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json to use (default: found beside the checkpoint or in its run)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N"
    )
    p.add_argument("--dtype", choices=DTYPES, help=_DTYPE_HELP)
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the whole sequence at every step instead of using a KV cache",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile the decoding step with torch.compile (on a 2-core CPU about 10 s before "
        "the first token, about 50 s the first time inductor runs on a machine; pays off for "
        "long outputs)",
    )
    p.set_defaults(func=_cmd_generate)


def _ids(text: str) -> list[int]:
    parts = [t.strip() for t in text.split(",")]
    if not parts or not all(re.fullmatch(r"\d{1,19}", t) for t in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids such as 1,2,3, got {text!r}"
        )
    return [int(t) for t in parts]


def model_file(text: str) -> tuple[Any, Any]:
    """`(checkpoint, tokenizer.json or None)` for a SPEC|CHECKPOINT argument, as Paths, or
    `(None, None)` for a spec: a model file, a checkpoint directory or a run directory (its
    newest checkpoint), with the tokenizer its metadata names (`lmcore.runs.find_model`)."""
    from pathlib import Path

    from lmcore.checkpoint import is_checkpoint_path
    from lmcore.runs import find_model

    p = Path(text)
    if p.is_dir() or (p.is_file() and is_checkpoint_path(text)):
        return find_model(p)
    return (p, None) if is_checkpoint_path(text) else (None, None)


def tokenizer_places(model: Any) -> tuple[list[Any], str | None]:
    """Where a checkpoint's tokenizer.json may be, in order: beside it, then each directory
    up to its run directory (the first holding run.json), then the data directory the run
    names; and why the run's data directory is unknown, when its run.json cannot be read
    (`lmcore.runs.read_run`'s message), else None."""
    from pathlib import Path

    from lmcore.errors import TrainError
    from lmcore.runs import RUN_FILE, TOKENIZER_FILE, read_run

    places, run = [], None
    for d in model.resolve().parents:
        places.append(d / TOKENIZER_FILE)
        if (d / RUN_FILE).is_file():
            run = d
            break
    if run is None:
        return places[:1], None
    try:
        info = read_run(run)
    except TrainError as e:
        return places, str(e)
    data = info.get("data")  # {"path": ...}
    path = data.get("path") if isinstance(data, dict) else None
    if isinstance(path, str):
        places.append(Path(path) / TOKENIZER_FILE)
    return places, None


def _tokenizer(args: argparse.Namespace, model: Any, named: Any) -> Any:
    """The tokenizer to use: --tokenizer, else the one the checkpoint's metadata names, else
    the first found for it (`tokenizer_places`); None when the prompt is ids and none is found
    (ids are then printed)."""
    from pathlib import Path

    from tokenizers import Tokenizer

    from lmcore.runs import TOKENIZER_FILE

    problem = None
    if args.tokenizer is not None:
        places = [Path(args.tokenizer)]
        if not places[0].is_file():
            raise UsageError(f"--tokenizer {args.tokenizer!r} does not exist")
    else:
        places = [named] if named else []
        if model is not None:
            more, problem = tokenizer_places(model)
            places += more
    found = next((p for p in places if p.is_file()), None)
    if found is None:
        if args.prompt is None:
            return None
        where = (
            f"looked for {TOKENIZER_FILE} in {', '.join(str(p.parent) for p in places)}"
            if places
            else "a spec has no tokenizer"
        )
        if problem is not None:
            where += f"; the run's data directory is unknown: {problem}"
        raise UsageError(
            f"--prompt needs a tokenizer, but none was found for {args.spec!r} ({where}); "
            "pass --tokenizer PATH (e.g. the tokenizer.json lmcore data prepare wrote), or give "
            "token ids with --prompt-ids 1,2,3"
        )
    try:
        return Tokenizer.from_file(str(found))
    except Exception as e:  # tokenizers raises a bare Exception for unparsable files
        raise UsageError(f"{str(found)!r} is not a Hugging Face tokenizer.json ({e})") from None


def _cmd_generate(args: argparse.Namespace) -> int:
    import time

    import torch

    from lmcore.checkpoint import build_from_checkpoint, read_info, resolve_checkpoint
    from lmcore.model import build_model
    from lmcore.train import resolve_device

    path, named = model_file(args.spec)
    device = resolve_device(args.device)
    if path is not None:
        with _checkpoint_warnings(args.command):
            info = read_info(path)
            bp = resolve_checkpoint(info)
        model = build_from_checkpoint(info, bp, device=device, dtype=_dtype(args, info))
    else:
        bp, _ = _source(args)
        torch.manual_seed(args.seed or 0)
        model = build_model(bp, device=device, dtype=_dtype(args, None))
    tok = _tokenizer(args, path, named)
    vocab = model.spec.vocab_size
    if args.prompt is not None:
        ids = tok.encode(args.prompt).ids
        if not ids:
            raise UsageError("--prompt encodes to no tokens; give some text")
    else:
        ids = args.prompt_ids
    if tok is not None and tok.get_vocab_size() > vocab:
        raise UsageError(
            f"the tokenizer has {tok.get_vocab_size():,} tokens but the model's vocab_size is "
            f"{vocab:,}; use the tokenizer the model was trained with"
        )
    stop = args.stop_token
    if stop is None and tok is not None:
        stop = tok.token_to_id("<|endoftext|>")
    n = args.max_new_tokens or max(1, min(256, model.spec.context_length - len(ids) + 1))
    if args.compile:
        from lmcore.generate import compile_decoding

        compile_decoding(model)
    start = time.perf_counter()
    steps = model.stream(
        torch.tensor(ids),
        n,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        stop_token=stop,
        seed=args.seed,
        cache=not args.no_cache,
    )
    out: list[int] = []
    shown = ""
    for t in steps:
        out.append(int(t))
        if tok is None:
            sys.stdout.write(f"{' ' if len(out) > 1 else ''}{out[-1]}")
        else:
            text = tok.decode(out)
            if text.endswith("\ufffd"):
                continue  # a character split across tokens: wait for its other bytes
            sys.stdout.write(text[len(shown) :])
            shown = text
        sys.stdout.flush()
    if tok is not None:
        sys.stdout.write(tok.decode(out)[len(shown) :])
    sys.stdout.write("\n")
    seconds = time.perf_counter() - start
    ended = " (stop token)" if stop is not None and out and out[-1] == stop else ""
    mode = "KV cache" if not args.no_cache else "recomputed each step"
    mode += ", compiled: the first step compiles" if args.compile else ""
    _say(
        f"lmcore generate: {len(out)} tokens{ended} in {seconds:.2f} s, "
        f"{len(out) / seconds:,.0f} tokens/s ({mode}, prompt {len(ids)} tokens, "
        f"{str(model.lm_head.weight.dtype).removeprefix('torch.')} on {device})"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
