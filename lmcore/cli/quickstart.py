"""`lmcore quickstart`: a small model learns Python from this Python's standard library."""

from __future__ import annotations

import argparse
from typing import Any

from lmcore.cli.common import exit_code, positive


def add_parser(sub: Any) -> None:
    from lmcore.train.quickstart import QUICKSTART_DATA, QUICKSTART_RUN, QUICKSTART_STEPS

    p = sub.add_parser(
        "quickstart",
        help="train a small model on this Python's standard library, in about a minute",
        description="Tokenise the running Python's standard library (once) and train a small "
        "model on it, printing the validation loss as it falls; it prints the two ordinary "
        "commands (data prepare, train) that do the same.",
    )
    p.add_argument(
        "--steps", type=positive, default=QUICKSTART_STEPS, help=f"default: {QUICKSTART_STEPS}"
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from lmcore.train.quickstart import quickstart

    result = quickstart(
        data=Path(args.data),
        out=None if args.out is None else Path(args.out),
        steps=args.steps,
        device=args.device,
    )
    return exit_code(result.status, result.reason)
