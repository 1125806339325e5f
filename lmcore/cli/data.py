"""`lmcore data prepare SOURCE... --out DIR`: a byte-level BPE tokenizer and token-id files."""

from __future__ import annotations

import argparse
from typing import Any

from lmcore.cli.common import UsageError


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
    p.add_argument(
        "sources", nargs="*", metavar="SOURCE", help="text files or directories (not with --chat)"
    )
    p.add_argument(
        "--chat",
        metavar="FILE.jsonl",
        help='conversations, one JSON object per line ({"messages": [{"role", "content"}, ...]} '
        'or {"instruction", "input", "output"}), rendered with the chat template of '
        "--tokenizer-from; writes a loss mask that trains only the assistant's tokens",
    )
    p.add_argument(
        "--tokenizer-from",
        metavar="CKPT",
        help="with --chat: the checkpoint (file, directory or run) whose tokenizer and chat "
        "template render the conversations",
    )
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

    if args.chat is not None or args.tokenizer_from is not None:
        return _chat(args)
    if not args.sources:
        raise UsageError(
            "give the text files or directories to prepare (lmcore data prepare SOURCE... "
            "--out DIR), or --chat FILE.jsonl --tokenizer-from CKPT for chat data"
        )

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


def _chat(args: argparse.Namespace) -> int:
    from lmcore.data.chat import chat_summary, prepare_chat

    if args.chat is None or args.tokenizer_from is None:
        given, missing = ("--chat", "--tokenizer-from CKPT") if args.tokenizer_from is None else (
            "--tokenizer-from", "--chat FILE.jsonl")  # fmt: skip
        raise UsageError(f"{given} needs {missing}: chat data is rendered with a checkpoint's "
                         "chat template (lmcore data prepare --chat FILE.jsonl --tokenizer-from "
                         "CKPT --out DIR)")  # fmt: skip
    text_only = [flag for flag, given in (
        ("SOURCE", bool(args.sources)), ("--vocab-size", args.vocab_size is not None),
        ("--tokenizer", args.tokenizer is not None), ("--ext", bool(args.ext)),
        ("--exclude", bool(args.exclude)), ("--skip-undecodable", args.skip_undecodable),
    ) if given]  # fmt: skip
    if text_only:
        raise UsageError(f"{', '.join(text_only)}: not with --chat, which reads one .jsonl file "
                         "with --tokenizer-from's tokenizer")  # fmt: skip
    saved, where = _checkpoint_tokenizer(args)
    result = prepare_chat(
        args.chat,
        args.out,
        tokenizer=saved,
        tokenizer_from=where,
        val_fraction=args.val_fraction,
        context_length=args.context_length,
        force=args.force,
    )
    print("\n".join(chat_summary(result)))
    return 0


def _checkpoint_tokenizer(args: argparse.Namespace) -> tuple[Any, str]:
    """The tokenizer (with its chat template) stored in --tokenizer-from's checkpoint (a file,
    a checkpoint directory or a run), and the model file it came from."""
    from lmcore.cli.common import checkpoint_warnings
    from lmcore.checkpoint import read_info
    from lmcore.errors import CheckpointError, DataError
    from lmcore.sources import locate

    text = args.tokenizer_from
    where = locate(text, directories=True)
    if where.kind != "checkpoint" or where.path is None:
        raise DataError(
            f"--tokenizer-from {text!r} is not a checkpoint; give an lmcore checkpoint "
            "(.safetensors, a checkpoint directory or a run) that stores its tokenizer and chat "
            "template (one converted from a GGUF file or a Hugging Face directory)"
        )
    try:
        with checkpoint_warnings(args.command):
            info = read_info(where.path)
    except CheckpointError as e:
        raise DataError(f"--tokenizer-from: {e}") from None
    if info.tokenizer is None:
        raise DataError(
            f"--tokenizer-from {where.path} stores no tokenizer; chat data is rendered with "
            "the model's own tokenizer and template: give a checkpoint converted from a GGUF "
            "file or a Hugging Face directory"
        )
    return info.tokenizer, str(where.path)
