"""`lmcore train SPEC --data DIR --out RUN` and `--resume RUN`; the training options that
`lmcore sweep` shares, each defaulting to `TrainConfig`'s.
"""

from __future__ import annotations

import argparse
from typing import Any

from lmcore.cli.common import OR_CHECKPOINT, UsageError, exit_code, source


def add_parser(sub: Any) -> None:
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
        help=f'spec string, e.g. "tinystories, vocab_size=2048"; {OR_CHECKPOINT}',
    )
    p.add_argument("--data", metavar="DIR", help="prepared data (lmcore data prepare)")
    p.add_argument("--out", metavar="RUN", help="the new run directory")
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the run in RUN from its newest checkpoint (no SPEC; --steps/--tokens "
        "may extend it)",
    )
    add_budget_options(p)
    add_parallel_options(p)
    p.set_defaults(func=run)


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    """`--parallel ddp|fsdp` under torchrun (lmcore.train.parallel)."""
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


def add_budget_options(p: argparse.ArgumentParser) -> None:
    """The training options of `train` and `sweep`, one flag per declared option of
    `TrainConfig` (lmcore.train.config); each defaults to None: not given."""
    from lmcore.train.config import TrainConfig
    from lmcore.train.options import add_flags

    add_flags(p, TrainConfig)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The training options given on the command line, as the flags give them."""
    from lmcore.train.config import TrainConfig
    from lmcore.train.options import given

    return given(args, TrainConfig)


def train_config(args: argparse.Namespace) -> Any:
    from lmcore.train.config import TrainConfig

    return TrainConfig.from_flags(given_options(args))


def run(args: argparse.Namespace) -> int:
    from lmcore.train.parallel import distributed  # one process, or torchrun's group

    with distributed(args.parallel, mixed_precision=args.mixed_precision) as parallel:
        if parallel.world_size > 1 and parallel.is_writer:
            print(f"parallel: {parallel!r}")
        return _train(args, parallel)


def _model(args: argparse.Namespace) -> Any:
    """SPEC's model; a directory that holds no Hugging Face config is a checkpoint or run
    directory, whose (newest) checkpoint a fine-tune starts from."""
    import os

    from lmcore.cli.common import opened
    from lmcore.sources import could_be_path, locate

    if could_be_path(args.spec) and os.path.isdir(args.spec):
        where = locate(args.spec)
        if where.kind != "hf":
            return opened(args, locate(args.spec, directories=True))
    return source(args)


def _train(args: argparse.Namespace, parallel: Any) -> int:
    from lmcore.train.trainer import resume, train

    if args.resume is not None:
        if args.spec is not None or args.out is not None:
            raise UsageError(
                f"--resume {args.resume} continues that run in its own directory: give neither "
                "SPEC nor --out with it"
            )
        changes = given_options(args)
        result = resume(args.resume, data=args.data, parallel=parallel, **changes)
        return exit_code(result.status, result.reason)
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
    result = train(_model(args), args.data, args.out, train_config(args), parallel=parallel)
    return exit_code(result.status, result.reason)
