"""`lmcore sweep BASE --vary ITEMS ...`: a baseline and its variants, trained alike, compared."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lmcore.cli.common import UsageError, exit_code
from lmcore.cli.train import add_budget_options, train_config


def add_parser(sub: Any) -> None:
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
    add_budget_options(p)
    p.add_argument(
        "--sort",
        metavar="KEY",
        help="print the table best first: val_loss, val_bpb (with --eval-bpb), train_loss or "
        "tokens_per_s (compare.md keeps the order of the runs)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lmcore.checkpoint import is_checkpoint_path
    from lmcore.train.sweep import ranked, sweep, table_markdown

    if is_checkpoint_path(args.base):
        raise UsageError(
            f"BASE {args.base!r} looks like a checkpoint path; a sweep trains every model from "
            "the start: give a spec (`lmcore describe CKPT` shows a checkpoint's spec)"
        )
    if args.sort is not None:
        ranked([], args.sort)  # a bad key fails before any training
    result = sweep(args.base, args.vary, args.data, args.out, train_config(args))
    md, js, png = result.files
    print()
    rows = result.rows if args.sort is None else ranked(result.rows, args.sort)
    print(table_markdown(rows), end="")
    print(f"\ntable: {md} (and {js.name}), validation curves: {png}")
    if result.interrupted is not None:
        print("interrupted; run the same command again to continue the sweep")
        return exit_code("interrupted", result.interrupted)
    for row in result.failed:
        print(f"lmcore sweep: error: {row.label}: {row.error}", file=sys.stderr)
    return 1 if result.failed else 0
