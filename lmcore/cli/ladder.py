"""`lmcore ladder BASE --vary ITEMS --rungs K --factor F ...` (and `--report LADDER`): a
baseline and its variants trained at K sizes chosen from the declarations, a scaling law fitted
to each, and each variant's compute multiplier over the baseline with its interval."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Final

from lmcore.cli.common import MAX_BYTES_HELP, UsageError, byte_count, exit_code, positive
from lmcore.cli.sweep import add_launcher_options, launcher_given
from lmcore.cli.train import add_budget_options, given_options

TABLE_MD: Final = "ladder.md"
FITS_JSON: Final = "fits.json"
POINTS_JSON: Final = "points.json"
PLOT_PNG: Final = "ladder.png"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ladder",
        help="train a baseline and its variants at sizes stepping by a factor; fit scaling "
        "laws and each variant's compute multiplier",
        description="Size K rungs from BASE (rung 0 is BASE itself): each rung's d_model, "
        "num_layers, heads and d_ff keep BASE's proportions so that its non-embedding "
        "parameters (or training FLOPs per token, --by flops, attention and lm_head included: "
        "the FLOPs lmcore describe declares) are the rung below's times --factor; each --vary "
        "is matched to its rung's baseline by the same measure. Every run trains "
        "--tokens-per-param R × N tokens (or --compute C FLOPs). Each rung is an lmcore sweep "
        "in LADDER/rung<k> under --seeds seeds, where --launcher puts it; then a saturating "
        "power law L(C) = E + A·C^−α is fitted per variant, with bootstrap intervals over "
        "seeds, each variant's compute multiplier over the baseline at --target-flops, and "
        "the largest rung predicted from the others; LADDER/ladder.md, fits.json, points.json "
        "and ladder.png. Running the same command again continues the ladder; --report "
        "LADDER re-fits it without training.",
    )
    p.add_argument("base", metavar="BASE", nargs="?",
                   help='the baseline spec of rung 0, e.g. "vocab_size=2048, context_length=128, '
                   'd_model=64, num_layers=2, num_heads=2"')  # fmt: skip
    p.add_argument("--vary", action="append", metavar="ITEMS",
                   help='a variant: key=value items replacing the base spec\'s (or its recipe\'s), '
                   'e.g. "pos=nope"; not the sizes the ladder chooses; repeatable')  # fmt: skip
    g = p.add_argument_group("the sizes")
    g.add_argument("--rungs", type=int, metavar="K", help="number of sizes (default 4; at least 3)")
    g.add_argument("--factor", type=float, metavar="F",
                   help="each rung's measure over the one below's (default 2)")  # fmt: skip
    g.add_argument("--by", choices=("params", "flops"),
                   help="the measure that steps by --factor: non-embedding parameters "
                   "(default) or training FLOPs per token")  # fmt: skip
    g.add_argument("--no-match", action="store_true",
                   help="keep each variant's d_ff as the rung's baseline has it (its size "
                   "mismatch is still reported); default: match it by --by")  # fmt: skip
    budget = g.add_mutually_exclusive_group()
    budget.add_argument("--tokens-per-param", type=float, metavar="R",
                        help="each rung trains R × its N tokens (Chinchilla: 20)")  # fmt: skip
    budget.add_argument("--compute", type=float, metavar="C",
                        help="each rung trains C FLOPs (its baseline's)")  # fmt: skip
    p.add_argument("--seeds", type=positive, metavar="N", default=1,
                   help="seeds per model: --seed, --seed + 1, ... (default 1; 2 or more for "
                   "intervals)")  # fmt: skip
    p.add_argument("--data", metavar="DIR", help="prepared data")
    p.add_argument("--out", metavar="LADDER", help="the ladder's directory")
    p.add_argument("--plan", action="store_true",
                   help="print the rungs (shapes, N, FLOPs per token, tokens, steps, compute, "
                   "memory) and exit without training")  # fmt: skip
    p.add_argument("--max-bytes", type=byte_count, metavar="BYTES",
                   help=f"per run: {MAX_BYTES_HELP}")  # fmt: skip
    f = p.add_argument_group("the fits")
    f.add_argument(
        "--report",
        metavar="LADDER",
        help="re-fit the finished runs of LADDER and print the table; no training",
    )
    f.add_argument("--target-flops", type=float, metavar="C",
                   help="the compute the multipliers are taken at (default: the baseline's "
                   "largest rung)")  # fmt: skip
    f.add_argument("--sort", metavar="KEY",
                   help="print the table by multiplier (largest first) or loss (at the "
                   "target, lowest first)")  # fmt: skip
    f.add_argument(
        "--bootstrap",
        type=int,
        metavar="N",
        default=1000,
        help="bootstrap resamples of the seeds (default 1000; 0: no intervals)",
    )
    add_budget_options(p)
    add_launcher_options(p)
    p.set_defaults(func=run)


def _check_fit_options(args: argparse.Namespace) -> None:
    from lmcore.ladder.fits import SORT_KEYS

    if args.sort is not None and args.sort not in SORT_KEYS:
        from lmcore.errors import did_you_mean

        raise UsageError(f"--sort {args.sort!r}: must be one of {', '.join(SORT_KEYS)}"
                         f"{did_you_mean(args.sort, SORT_KEYS)}")  # fmt: skip
    if args.target_flops is not None and not (math.isfinite(args.target_flops)
                                              and args.target_flops > 0):  # fmt: skip
        raise UsageError(f"--target-flops {args.target_flops}: must be a finite number above 0")
    if args.bootstrap < 0 or args.bootstrap > 100_000:
        raise UsageError(f"--bootstrap {args.bootstrap}: must be an integer from 0 to 100000")


def run(args: argparse.Namespace) -> int:
    _check_fit_options(args)
    if args.report is not None:
        return _report_only(args)
    return _ladder(args)


def _report_only(args: argparse.Namespace) -> int:
    given = [flag for flag, v in (("BASE", args.base), ("--vary", args.vary),
             ("--rungs", args.rungs), ("--factor", args.factor), ("--by", args.by),
             ("--tokens-per-param", args.tokens_per_param), ("--compute", args.compute),
             ("--data", args.data), ("--out", args.out)) if v is not None]  # fmt: skip
    given += [f"--{k.replace('_', '-')}" for k in given_options(args)]
    if given or args.plan:
        raise UsageError(
            f"--report {args.report} re-fits that ladder as it was run: give none of "
            f"{', '.join(given or ['--plan'])} with it (only --target-flops, --sort, --bootstrap)"
        )
    from lmcore.ladder.runs import collect_points, read_ladder

    info = read_ladder(args.report)
    points, missing = collect_points(args.report, info)
    for line in missing:
        print(f"  {line}: no point")
    return _fit(args, Path(args.report), points)


def _ladder(args: argparse.Namespace) -> int:
    from lmcore.ladder.sizing import check_memory, plan_markdown, size_ladder
    from lmcore.sources import is_checkpoint_path
    from lmcore.train.config import TrainConfig

    if args.base is None:
        raise UsageError(
            "give a BASE spec (rung 0) and --vary ITEMS, e.g. lmcore ladder "
            '"vocab_size=2048, context_length=128, d_model=64, num_layers=2, num_heads=2" '
            "--vary pos=nope --tokens-per-param 20 --data DIR --out LADDER; or --report LADDER"
        )
    if is_checkpoint_path(args.base):
        raise UsageError(f"BASE {args.base!r} looks like a checkpoint path; a ladder trains "
                         "every model from the start: give a spec")  # fmt: skip
    options = given_options(args)
    for key in ("steps", "tokens"):
        if key in options:
            raise UsageError(
                f"--{key} is the ladder's to choose: every rung trains --tokens-per-param R × "
                "N tokens (or --compute C FLOPs) in steps of --batch-size × the context"
            )
    cfg = TrainConfig.from_flags(options)
    plan = size_ladder(
        args.base, list(args.vary or ()), rungs=4 if args.rungs is None else args.rungs,
        factor=2.0 if args.factor is None else args.factor, by=args.by or "params",
        tokens_per_param=args.tokens_per_param, compute=args.compute,
        batch_size=cfg.batch_size, context=cfg.context, match=not args.no_match, config=cfg,
    )  # fmt: skip
    plan = check_memory(plan, cfg.device, micro_batch=cfg.micro_batch, max_bytes=args.max_bytes)
    if not args.plan:
        missing = [f for f, v in (("--data DIR", args.data), ("--out LADDER", args.out))
                   if v is None]  # fmt: skip
        if missing:
            raise UsageError(
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "needed to train a ladder (or --plan to only print its sizes)"
            )
    print(plan_markdown(plan), end="")
    if args.plan:
        return 0
    print()
    from lmcore.data.tokens import TokenData
    from lmcore.ladder.runs import run_ladder
    from lmcore.train.launch import LauncherOptions

    tokens = TokenData.open(args.data)
    tokens.check(context_length=plan.rungs[0].baseline.blueprint.spec.context_length,
                 vocab_size=plan.rungs[0].baseline.blueprint.spec.vocab_size)  # fmt: skip
    launcher = LauncherOptions(**launcher_given(args))
    result = run_ladder(plan, args.data, args.out, cfg, seeds=args.seeds, launcher=launcher)
    for line in result.missing:
        print(f"  {line}: no point")
    if result.interrupted is not None:
        print("interrupted; run the same command again to continue the ladder")
        return exit_code("interrupted", result.interrupted)
    for row in result.failed:  # before the fit, which may refuse a variant missing a rung
        print(f"lmcore ladder: error: {row.label}, seed {row.seed}: {row.error}", file=sys.stderr)
    code = _fit(args, Path(args.out), result.points)
    return 1 if result.failed else code


def _fit(args: argparse.Namespace, root: Path, points: list[Any]) -> int:
    """Fit the points, print the table, write ladder.md, fits.json, points.json, ladder.png."""
    from lmcore.atomic import atomic_write
    from lmcore.ladder.fits import fit_ladder
    from lmcore.ladder.report import plot_ladder
    from lmcore.ladder.runs import write_points
    from lmcore.train.runs import write_json
    from lmcore.train.sweep import BASELINE

    write_points(points, root / POINTS_JSON)
    fit = fit_ladder(points, baseline=BASELINE, target_flops=args.target_flops,
                     bootstrap=args.bootstrap)  # fmt: skip
    table = fit.table(args.sort)
    with atomic_write(root / TABLE_MD, "w") as out:
        out.write(f"# ladder {root.name}\n\n{table}")
    write_json(root / FITS_JSON, fit.to_json(args.sort))
    plot_ladder(fit, root / PLOT_PNG, title=f"ladder {root.name}")
    print()
    print(table, end="")
    print(f"\ntable: {root / TABLE_MD} (and {FITS_JSON}, {POINTS_JSON}), plot: {root / PLOT_PNG}")
    return 0
