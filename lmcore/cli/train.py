"""`lmcore train SPEC --data DIR --out RUN` and `--resume RUN`; the training options that
`lmcore sweep` shares, each defaulting to `TrainConfig`'s.
"""

from __future__ import annotations

import argparse
from typing import Any

from lmcore.cli.common import OR_CHECKPOINT, UsageError, exit_code, positive, seed_value, source


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
    """The training options of `train` and `sweep`; each defaults to TrainConfig's."""
    from lmcore.train.config import AUTOCAST, DTYPES, TRACKERS, TrainConfig

    d = TrainConfig()
    budget = p.add_mutually_exclusive_group()
    budget.add_argument(
        "--steps", type=positive, metavar="N", help=f"optimizer steps (default: {d.steps})"
    )
    budget.add_argument(
        "--tokens",
        type=positive,
        metavar="N",
        help="train on N tokens instead: steps = ceil(N / (batch size × context length))",
    )
    options: list[tuple[str, Any, str, str]] = [
        ("--batch-size", positive, "B", f"sequences per step (default: {d.batch_size})"),
        ("--lr", float, "LR", f"peak learning rate (default: {d.lr:g})"),
        ("--min-lr", float, "LR", "the cosine schedule's floor (default: lr / 10)"),
        ("--warmup", int, "N", "linear warmup steps (default: 10%% of the steps)"),
        ("--weight-decay", float, "WD", f"AdamW's, on matrices only (default: {d.weight_decay:g})"),
        ("--grad-clip", float, "NORM", f"global gradient norm; 0: off (default: {d.grad_clip:g})"),
        ("--eval-every", int, "N", f"steps between evaluations; 0: only first and last "
                                   f"(default: {d.eval_every})"),
        ("--eval-batches", positive, "N", f"fixed validation batches (default: {d.eval_batches})"),
        ("--log-every", positive, "N", f"steps per metrics record (default: {d.log_every})"),
        ("--save-every", int, "N", f"steps between checkpoints; 0: only at the end "
                                   f"(default: {d.save_every})"),
        ("--keep", int, "N", f"newest checkpoints kept; 0: all (default: {d.keep})"),
        ("--seed", seed_value, "N", f"initial weights and batch order (default: {d.seed})"),
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
    p.add_argument(
        "--eval-bpb",
        action="store_true",
        default=None,
        help="evaluations also report bits per byte (val_bpb in metrics.jsonl): the loss in "
        "bits per UTF-8 byte of the validation text, comparable across tokenizers",
    )
    p.add_argument(
        "--logger",
        action="append",
        choices=TRACKERS,
        dest="loggers",
        help="also log to this experiment tracker (repeatable; each needs its extra, e.g. "
        "pip install 'lmcore-registry[tensorboard]'); metrics.jsonl and loss.png are always "
        "written",
    )
    p.add_argument(
        "--log-group",
        metavar="NAME",
        help="the trackers' experiment (MLflow) and group (W&B) (default: lmcore; a sweep's "
        "directory name in a sweep)",
    )


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The training options given on the command line, as TrainConfig fields."""
    from lmcore.train.config import CLI_OPTIONS

    given = {k: getattr(args, k) for k in CLI_OPTIONS if getattr(args, k, None) is not None}
    for key in ("betas", "loggers"):
        if key in given:
            given[key] = tuple(given[key])
    return given


def train_config(args: argparse.Namespace) -> Any:
    from lmcore.train.config import TrainConfig

    given = given_options(args)
    if given.get("grad_clip") == 0:
        given["grad_clip"] = None
    return TrainConfig(**given)


def run(args: argparse.Namespace) -> int:
    from lmcore.train.parallel import distributed  # one process, or torchrun's group

    with distributed(args.parallel, mixed_precision=args.mixed_precision) as parallel:
        if parallel.world_size > 1 and parallel.is_writer:
            print(f"parallel: {parallel!r}")
        return _train(args, parallel)


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
    result = train(source(args), args.data, args.out, train_config(args), parallel=parallel)
    return exit_code(result.status, result.reason)
