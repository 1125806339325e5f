"""`lmcore coordcheck SPEC`: muP's coordinate check of a spec, muP and the standard
parametrization side by side: the table of each activation's update scale per width with its
log-log slope, and the plot (`lmcore.train.coordcheck`).
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
from typing import Any

from lmcore.cli.common import UsageError, positive, seed_value

MAX_WIDTH = 8192  # a check on CPU; a wider model is a training run, not a check


def widths(text: str) -> tuple[int, ...]:
    """argparse's type for ``64,128,256,512``: at least two increasing widths, each at most
    `MAX_WIDTH`."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 2 or not all(re.fullmatch(r"\d{1,12}", p) for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected two or more comma-separated widths, e.g. 64,128,256,512; got {text!r}"
        )
    values = tuple(int(p) for p in parts)
    if any(b <= a for a, b in itertools.pairwise(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError(f"widths must increase from 1 up, got {text!r}")
    if values[-1] > MAX_WIDTH:
        raise argparse.ArgumentTypeError(f"widths go up to {MAX_WIDTH} here, got {values[-1]}")
    return values


def learning_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 10):
        raise argparse.ArgumentTypeError(f"expected a learning rate in (0, 10], got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "coordcheck",
        help="muP's coordinate check: activation updates by width, muP beside standard",
        description="Train the spec's model a few AdamW steps at each width (d_model; d_ff in "
        "proportion) under parametrization=mup and under the standard parametrization, and "
        "print how far the steps moved each activation (mean |x_t - x_0|) with its log-log "
        "slope against the width: flat under muP, growing under the standard one.",
    )
    p.add_argument("spec", help='spec string, e.g. "cs336-tiny"; its parametrization= (if '
                   "any) is the muP side's, else mup(base_width=<smallest width>)")  # fmt: skip
    p.add_argument("--widths", type=widths, default=(64, 128, 256, 512),
                   help="comma-separated d_model values (default: 64,128,256,512)")  # fmt: skip
    p.add_argument("--steps", type=positive, default=3, help="AdamW steps (default: 3)")
    p.add_argument("--lr", type=learning_rate, default=1e-2, help="learning rate (default: 1e-2)")
    p.add_argument("--batch", type=positive, default=2, help="sequences per step (default: 2)")
    p.add_argument("--seq", type=positive, default=16,
                   help="tokens per sequence (default: 16, at most context_length)")  # fmt: skip
    p.add_argument("--seed", type=seed_value, default=0, help="seeds weights and tokens")
    p.add_argument("--plot", default="coordcheck.png", help="where the plot goes "
                   "(default: coordcheck.png)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lmcore.blueprint import resolve
    from lmcore.train.coordcheck import TOLERANCE, coordinates, plot, table

    bp = resolve(args.spec)
    if bp.spec.layers:
        raise UsageError(f"{args.spec!r}: coordcheck takes a spec without per-layer values")
    ours = bp.spec.parametrization
    mup = str(ours) if ours is not None else f"mup(base_width={args.widths[0]})"
    train = dict(steps=args.steps, lr=args.lr, batch=args.batch, seq=args.seq, seed=args.seed)
    runs = [
        coordinates(bp, widths=args.widths, parametrization=mup, label=f"muP: {mup}", **train),
        coordinates(bp, widths=args.widths, parametrization=None, label="SP", **train),
    ]
    print(table(*runs))
    worst = {r.label: max(abs(s) for s in r.slopes().values()) for r in runs}
    print("largest |slope|: " + ", ".join(f"{k} {v:.3f}" for k, v in worst.items())
          + f" (muP passes at <= {TOLERANCE})")  # fmt: skip
    out = plot(runs, args.plot, title=args.spec)
    print(f"plot: {out}")
    return 0
