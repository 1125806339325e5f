"""`lmcore data prepare SOURCE... --out DIR`: a byte-level BPE tokenizer and token-id files."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
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
    p.set_defaults(func=run, command="data prepare")


def run(args: argparse.Namespace) -> int:
    from lmcore.data.preparing import prepare, summary_lines
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
    print("\n".join(summary_lines(result)))
    return 0
