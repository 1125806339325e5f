"""`lmcore sweep BASE --vary ITEMS ...` (or `lmcore sweep FILE.toml`, `--resume SWEEP`): a
baseline and its variants under N seeds, trained alike where a launcher puts them, compared
with paired intervals."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from lmcore.cli.common import UsageError, exit_code, positive
from lmcore.cli.train import add_budget_options, given_options


def add_parser(sub: Any) -> None:
    from lmcore.train.variants import RECIPE_KEYS

    p = sub.add_parser(
        "sweep",
        help="train a baseline and its variants under N seeds alike; compare them with intervals",
        description="Train BASE and, for each --vary, BASE with those key=value items "
        "replaced (a model key changes the spec, a recipe key such as optimizer or schedule "
        "the training options of the variant's runs), under --seeds N seeds (seed k of every "
        "variant sees the same batches in the same order), with the same options, into "
        "SWEEP/<name>-<hash>-seed<S>; write "
        "SWEEP/compare.md (mean final validation loss per variant, the 95% paired "
        "t-interval of its difference from the baseline), compare.json, val_loss.png and "
        "sweep.toml. BASE may be a sweep file (.toml) holding all of it. Runs go where "
        "--launcher says: this process, SLURM (submitit) or Ray. A failed or diverged run is "
        "reported and the others go on; running the same command again (or --resume SWEEP) "
        "continues the sweep without training anything twice.",
    )
    p.add_argument(
        "base",
        metavar="BASE",
        nargs="?",
        help='the baseline spec, e.g. "tinystories", or a sweep file, e.g. sweep.toml',
    )
    p.add_argument(
        "--vary",
        action="append",
        metavar="ITEMS",
        help='a variant: key=value items replacing the base spec\'s, e.g. "norm=none" or '
        f'"pos=nope, num_layers=6", or the recipe of its runs ({", ".join(RECIPE_KEYS)}), '
        'e.g. "schedule=wsd" or "optimizer=torch_adamw, lr=3e-3"; repeatable',
    )
    p.add_argument("--data", metavar="DIR", help="prepared data")
    p.add_argument("--out", metavar="SWEEP", help="the sweep's directory")
    p.add_argument(
        "--resume", metavar="SWEEP", help="continue the sweep in SWEEP from its sweep.toml"
    )
    p.add_argument(
        "--seeds", type=positive, metavar="N", help="seeds per variant: --seed, --seed + 1, ..."
    )
    p.add_argument(
        "--match",
        choices=("params", "flops"),
        help="choose each variant's d_ff so that its non-embedding parameters (or training "
        "FLOPs per token) match the baseline's within 1%%",
    )
    add_budget_options(p)
    p.add_argument(
        "--sort",
        metavar="KEY",
        help="print the table best first: val_loss, val_bpb (with --eval-bpb), train_loss or "
        "tokens_per_s (compare.md keeps the order of the runs)",
    )
    add_launcher_options(p)
    p.set_defaults(func=run)


def add_launcher_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where the runs execute")
    g.add_argument(
        "--launcher",
        choices=("local", "submitit", "ray"),
        help="local: one after another in this process (default); submitit: a SLURM job "
        "array, one job per run; ray: one Ray task per run",
    )
    g.add_argument(
        "--threads",
        type=positive,
        metavar="N",
        help="torch threads per run (default: torch's own locally, else the CPUs per run); "
        "the same N gives the same numbers under every launcher",
    )
    g.add_argument(
        "--cpus-per-run", type=positive, metavar="N", help="CPUs a run holds (Ray: default 1)"
    )
    g.add_argument("--gpus-per-run", type=int, metavar="N", help="GPUs a run holds (default 0)")
    g.add_argument("--slurm-partition", metavar="NAME", help="sbatch --partition")
    g.add_argument(
        "--slurm-time",
        metavar="TIME",
        help="sbatch --time per run: minutes or [D-]HH:MM:SS (default 60)",
    )
    g.add_argument(
        "--slurm-extra",
        action="append",
        metavar="KEY=VALUE",
        help="any other sbatch option, e.g. account=cs336 or qos=high; repeatable",
    )
    g.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join this Ray cluster (HOST:PORT, ray://HOST:PORT or auto; HOST:PORT is probed "
        "first, with a connect timeout of 15 s); default: a local Ray for the sweep",
    )


_DEFINITION = ("base", "vary", "data", "out", "seeds", "match")


def launcher_given(args: argparse.Namespace) -> dict[str, Any]:
    """The launcher options given on the command line, as `LauncherOptions` fields."""
    given: dict[str, Any] = {
        "name": args.launcher, "threads": args.threads, "cpus_per_run": args.cpus_per_run,
        "gpus_per_run": args.gpus_per_run, "slurm_partition": args.slurm_partition,
        "slurm_time": args.slurm_time, "ray_address": args.ray_address,
    }  # fmt: skip
    if args.slurm_extra:
        extra = {}
        for item in args.slurm_extra:
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise UsageError(
                    f"--slurm-extra {item!r}: expected KEY=VALUE, e.g. account=cs336 (an "
                    "sbatch option without its dashes)"
                )
            extra[key.strip()] = value.strip()
        given["slurm_extra"] = extra
    return {k: v for k, v in given.items() if v is not None}


def definition(args: argparse.Namespace) -> tuple[Any, str | None]:
    """The sweep's definition: the sweep file's (BASE.toml, or SWEEP/sweep.toml with
    --resume) with the command line's options in place of its own; and the file's name."""
    from lmcore.train.sweep import DEFINITION_FILE, SWEEP_FILE, read_sweep_json
    from lmcore.train.sweepfile import SweepDefinition, merged, read_definition, train_table

    source = None
    file = SweepDefinition()
    if args.resume is not None:
        given = [f"--{k}" if k != "base" else "BASE" for k in _DEFINITION
                 if getattr(args, k) is not None] + [f"--{k.replace('_', '-')}"
                                                     for k in given_options(args)]  # fmt: skip
        if given:
            raise UsageError(
                f"--resume {args.resume} continues that sweep as it is defined in its "
                f"{DEFINITION_FILE}: give none of {', '.join(given)} with it (launcher "
                "options may change)"
            )
        root = Path(args.resume)
        if not (root / DEFINITION_FILE).is_file():
            raise UsageError(
                f"--resume {args.resume}: no {DEFINITION_FILE} there; give the directory of a "
                "sweep (lmcore sweep writes SWEEP/sweep.toml when it starts)"
            )
        source = str(root / DEFINITION_FILE)
        file = read_definition(source)
        described = root / SWEEP_FILE
        data = read_sweep_json(described).get("data") if described.is_file() else None
        file = merged(file, out=str(root), data=data or file.data)
    elif args.base is not None and args.base.endswith(".toml"):
        source = args.base
        file = read_definition(source)
    elif args.base is not None:
        file = merged(file, base=args.base)
    train = train_table(given_options(args))
    result = merged(
        file,
        variants=tuple(args.vary) if args.vary else None,
        data=args.data,
        out=args.out,
        seeds=args.seeds,
        match=args.match,
        train=train,
        launcher=launcher_given(args),
    )
    missing = [what for what, value in (("BASE", result.base), ("--data DIR", result.data),
               ("--out SWEEP", result.out)) if value is None]  # fmt: skip
    if not result.variants:
        missing.append("--vary ITEMS")
    if missing:
        where = f" (neither on the command line nor in {source})" if source else ""
        raise UsageError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} needed{where}: a "
            "sweep trains BASE and each --vary on --data into --out; or give a sweep file"
        )
    return result, source


def run(args: argparse.Namespace) -> int:
    from lmcore.sources import is_checkpoint_path
    from lmcore.train.summary import ranked_summaries, summary_markdown
    from lmcore.train.sweep import sweep
    from lmcore.train.sweepfile import train_config

    if args.base is not None and args.resume is not None:
        raise UsageError(f"--resume {args.resume} continues a sweep: give no BASE with it")
    defn, source = definition(args)
    if is_checkpoint_path(defn.base):
        raise UsageError(
            f"BASE {defn.base!r} looks like a checkpoint path; a sweep trains every model from "
            "the start: give a spec (`lmcore describe CKPT` shows a checkpoint's spec)"
        )
    if args.sort is not None:
        ranked_summaries([], args.sort)  # a bad key fails before any training
    result = sweep(defn.base, list(defn.variants), defn.data, defn.out,
                   train_config(defn.train), seeds=defn.seeds, match=defn.match,
                   launcher=defn.launcher, source=source)  # fmt: skip
    md, js, png = result.files
    print()
    summaries = result.summaries
    if args.sort is not None:
        summaries = ranked_summaries(summaries, args.sort)
    print(summary_markdown(summaries), end="")
    print(f"\ntable: {md} (and {js.name}), validation curves: {png}")
    if result.interrupted is not None:
        print(f"interrupted; run the same command again (or lmcore sweep --resume {defn.out}) "
              "to continue the sweep")  # fmt: skip
        return exit_code("interrupted", result.interrupted)
    for row in result.failed:
        print(f"lmcore sweep: error: {row.label}, seed {row.seed}: {row.error}", file=sys.stderr)
    return 1 if result.failed else 0
