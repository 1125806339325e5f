"""`lmcore run SPEC`: forward+backward steps on random tokens, a smoke test for any spec, and its
report.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from lmcore.cli.common import (
    DTYPE_HELP,
    DTYPES,
    MAX_BYTES_HELP,
    OR_CHECKPOINT,
    byte_count,
    check_seq,
    positive,
    seed_value,
    show_bytes,
    source,
    torch_dtype,
)

if TYPE_CHECKING:
    from lmcore.train.smoke import RunResult


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="forward+backward steps on random tokens; report tokens/s and peak memory",
        description="A smoke test for any spec: build the model, run forward+backward steps on "
        "random token ids (next-token cross-entropy, no weight update) and report throughput, "
        "peak memory and whether the gradient reached every parameter.",
    )
    p.add_argument(
        "spec",
        help=f'spec string, e.g. "tinystories"; {OR_CHECKPOINT}, whose weights the steps '
        "start from",
    )
    p.add_argument(
        "--steps", type=positive, default=10, help="forward+backward steps (default: 10)"
    )
    p.add_argument("--batch", type=positive, default=2, help="sequences per step (default: 2)")
    p.add_argument(
        "--seq", type=positive, help="tokens per sequence (default: min(128, context_length))"
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N"
    )
    p.add_argument("--dtype", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument(
        "--seed", type=seed_value, default=0, help="seeds the weights and the tokens (0 .. 2**64-1)"
    )
    p.add_argument("--max-bytes", type=byte_count, help=MAX_BYTES_HELP + " (weights and a step)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from lmcore.train.smoke import ProgressBar, run_steps

    src = source(args)
    check_seq(args, src.blueprint.spec.context_length)
    result = run_steps(
        src,
        steps=args.steps,
        batch=args.batch,
        seq_len=args.seq,
        device=args.device,
        dtype=torch_dtype(args, src.info),
        seed=args.seed,
        progress=ProgressBar(sys.stderr),
        max_bytes=args.max_bytes,
    )
    print("\n".join(run_lines(result)))
    bad_loss = [i + 1 for i, x in enumerate(result.losses) if not math.isfinite(x)]
    if bad_loss:
        print(
            "lmcore run: error: the loss is not finite at step(s) "
            f"{', '.join(map(str, bad_loss))}; "
            "check the components' numerics (with bfloat16, try --dtype float32)",
            file=sys.stderr,
        )
    if result.gradient_problems:
        print(
            f"lmcore run: error: {len(result.gradient_problems)} parameter tensor(s) got no usable "
            f"gradient ({'; '.join(result.gradient_problems)}); a component holds parameters its "
            "forward does not use, or its backward is broken",
            file=sys.stderr,
        )
    return 0 if result.ok else 1


def run_lines(r: RunResult) -> list[str]:
    """`lmcore run`'s report."""

    tokens = r.steps * r.batch * r.seq_len
    timed = "the one step" if r.steps == 1 else f"steps 2-{r.steps}; step 1 warms up"
    peak = "unknown" if r.peak_memory is None else show_bytes(r.peak_memory)
    if r.gradient_problems:
        grads = f"{len(r.gradient_problems)} parameter(s) without a usable gradient: " + "; ".join(
            r.gradient_problems
        )
    else:
        grads = f"all {r.param_tensors} parameter tensors received a finite, non-zero gradient"
    return [
        f"spec: {r.spec}",
        f"model: {r.params:,} parameters, {r.dtype} on {r.device}",
        f"run: {r.steps} steps × batch {r.batch} × seq {r.seq_len} = {tokens:,} random tokens, "
        "forward + backward of next-token cross-entropy, no weight update",
        f"loss: first {r.losses[0]:.4f}, last {r.losses[-1]:.4f} "
        f"(ln vocab_size = {math.log(r.spec.vocab_size):.4f})",
        f"throughput: {r.tokens_per_second:,.0f} tokens/s ({timed})",
        f"peak memory: {peak} ({r.peak_memory_kind})",
        f"gradients: {grads}",
    ]
