"""`lmcore build SPEC`: build a model (seeded weights, or a checkpoint's), print its canonical spec
and parameter count, and optionally save it.
"""

from __future__ import annotations

import argparse
from typing import Any

from lmcore.cli.common import (
    DTYPE_HELP,
    DTYPES,
    MAX_BYTES_HELP,
    OR_CHECKPOINT,
    byte_count,
    checkpoint_warnings,
    seed_value,
    show_bytes,
    source,
    torch_dtype,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="build a model and print its canonical spec and size",
        description="Build a model from a spec (seeded weights) or a checkpoint (its weights), "
        "print its canonical spec and parameter count, and optionally save it.",
    )
    p.add_argument("spec", help=f'spec string, e.g. "tinystories, pos=nope"; {OR_CHECKPOINT}')
    p.add_argument("--dtype", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument("--device", default="cpu", help="torch device (meta: no allocation)")
    p.add_argument(
        "--seed",
        type=seed_value,
        default=0,
        help="seeds a spec's weights (0 .. 2**64-1; default: 0)",
    )
    p.add_argument(
        "--save", metavar="PATH", help="save the model to PATH (.safetensors) with its spec"
    )
    p.add_argument("--max-bytes", type=byte_count, help=MAX_BYTES_HELP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from lmcore.checkpoint import save
    from lmcore.model.inputs import check_device
    from lmcore.model.transformer import build_model

    src = source(args)
    dtype = torch_dtype(args, src.info)
    device = check_device(args.device)
    if src.info is not None and device.type != "meta":
        with checkpoint_warnings(args.command):
            model = src.model(device, dtype, args.max_bytes)  # the checkpoint's weights
    else:  # seeded weights (a checkpoint's structure alone on meta)
        torch.manual_seed(args.seed)
        model = build_model(src.blueprint, device=device, dtype=dtype, max_bytes=args.max_bytes)
    n = sum(p.numel() for p in model.parameters())
    print(model.spec)
    print(f"parameters: {n:,}")
    if args.save is not None:
        path = save(model, args.save)
        size = show_bytes(path.stat().st_size)
        print(f"saved: {path} ({size}, {str(dtype).removeprefix('torch.')})")
    return 0
