"""`lmcore quantize CKPT --int8|--int4`: a checkpoint with its matrices stored quantized."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

from lmcore.cli.common import UsageError, show_bytes

# The option -> the weight format it writes (`plugins/lmcore_quant.py`).
FORMATS: Final = {"int8": "int8", "int4": "q4_1"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "quantize",
        help="store a checkpoint's matrices quantized (int8, or int4 in groups of 32)",
        description="Write a copy of an lmcore checkpoint whose hidden matrices, head and token "
        "embeddings are stored in a weight format (spec key quant=): --int8, int8 with one "
        "scale per row; --int4, 4-bit in groups of 32 with a scale and a zero each (GGML's "
        "Q4_1). Norms and biases stay as they are. The spec records the format; generate, "
        "chat and eval run the file as any other, and convert --to-gguf writes it.",
    )
    p.add_argument("checkpoint", metavar="CKPT", help="an lmcore checkpoint (not quantized)")
    p.add_argument("--int8", action="store_true", help="int8, one float32 scale per row")
    p.add_argument("--int4", action="store_true", help="4-bit, a scale and a zero per 32")
    p.add_argument("--out", metavar="OUT.safetensors",
                   help="where to write (default: CKPT's name with -int8 or -int4)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from lmcore.checkpoint import read_info
    from lmcore.hf.convert import refuse_same
    from lmcore.quantizing import quantize_model
    from lmcore.runfiles import find_checkpoint
    from lmcore.sources import load

    if args.int8 == args.int4:
        raise UsageError("give one of --int8 and --int4 (the format of the matrices)")
    option = "int8" if args.int8 else "int4"
    source = find_checkpoint(args.checkpoint)
    info = read_info(source)
    held = [c.name for c in info.components.values() if c.kind == "quant"]
    if held:
        raise UsageError(
            f"{args.checkpoint} is quantized already ({held[0]}); quantizing it again would "
            "round rounded weights: quantize the float checkpoint it came from"
        )
    out = Path(args.out or source.with_name(f"{source.stem}-{option}.safetensors"))
    refuse_same(str(source), str(out), "the checkpoint")
    start = time.perf_counter()
    model = quantize_model(load(source), FORMATS[option])
    written = model.save(out)
    saved = read_info(written)
    print(f"spec: {saved.spec}")
    print(f"wrote: {written} ({show_bytes(saved.size)}, {option}, lmcore checkpoint; "
          f"{show_bytes(info.size)} before) in {time.perf_counter() - start:.1f} s")  # fmt: skip
    return 0
