"""`lmcore compare RUN...`: the comparison table (and plot) of existing runs."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="compare runs: final losses, throughput, validation curves",
        description="Print a Markdown table of existing runs (parameters, final train and "
        "validation loss, the difference to the first run, tokens/s, wall time, status; the "
        "recipe, optimizer · schedule, in a column when the runs differ in it, else in a line "
        "under the table); "
        "with --out also write compare.md, compare.json and val_loss.png there.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--out", metavar="DIR", help="write the table, its JSON and the plot here")
    p.add_argument(
        "--sort",
        metavar="KEY",
        help="rank the runs, best first: val_loss, val_bpb (bits per byte, lmcore train "
        "--eval-bpb; comparable across tokenizers), train_loss or tokens_per_s (default: in "
        "the order given)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lmcore.train.sweep import compare_runs, ranked, table_markdown, write_comparison

    rows = compare_runs(args.runs)
    if args.sort is not None:
        rows = ranked(rows, args.sort)
    print(table_markdown(rows), end="")
    if args.out is not None:
        md, js, png = write_comparison(rows, args.out, f"{len(rows)} runs")
        print(f"\ntable: {md} (and {js.name}), validation curves: {png}")
    return 0
