"""lmcore against transformers' own modeling code on converted weights: a Qwen3-shaped dense model
(grouped-query attention with q/k RMSNorm) and a Mixtral-shaped mixture of experts.

    python benchmarks/hf_families.py [--rounds 7] [--batch 4] [--seq 256] [--threads 1]
                                     [--clock cpu|wall] [--quick] [--profile qwen3|mixtral]

Each family's model is made at random with `AutoModelForCausalLM.from_config` (eager attention,
the reference the conversion is exact against), saved, and converted with `lmcore.hf.load_hf`;
the script checks that the logits agree (max abs difference printed) before timing anything.
Then, interleaved so that both see the same machine load, every round times an inference forward
(`torch.no_grad`) of each model back to back in alternating order, then a training step of each
(forward, cross-entropy on the next token, backward, AdamW step). It prints tokens/s (median of
the rounds) and lmcore's ratio to transformers (median of the per-round ratios with their
quartiles; above 1.0 means lmcore is faster). `--profile NAME` prints torch.profiler's table of
one training step of each side instead.

Never run by the test suite; never asserts a timing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                  max_position_embeddings=1024, tie_word_embeddings=False),
    "mixtral": dict(vocab_size=8192, hidden_size=384, intermediate_size=768, num_hidden_layers=4,
                    num_attention_heads=6, num_key_value_heads=2, num_local_experts=8,
                    num_experts_per_tok=2, max_position_embeddings=1024),
}  # fmt: skip


def make(name: str, directory: Path, quick: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import AutoConfig, AutoModelForCausalLM

    import lmcore.hf

    shape = dict(SHAPES[name])
    if quick:
        shape["num_hidden_layers"] = 2
    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **shape)
    theirs = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.02 * torch.randn_like(p))
    theirs.save_pretrained(directory / name)
    ours = lmcore.hf.load_hf(directory / name)
    return ours, theirs


def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return out if isinstance(out, torch.Tensor) else out.logits


def steps(model: torch.nn.Module, ids: torch.Tensor) -> tuple[Callable[[], None], ...]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward() -> None:
        model.eval()
        with torch.no_grad():
            logits_of(model, ids)

    def train() -> None:
        model.train()
        logits = logits_of(model, ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
        )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return forward, train


def clock(kind: str) -> Callable[[], float]:
    return time.process_time if kind == "cpu" else time.perf_counter


def timed(fn: Callable[[], None], now: Callable[[], float]) -> float:
    start = now()
    fn()
    return now() - start


def quartiles(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:.2f}x [{q[0]:.2f}-{q[2]:.2f}]"


def bench(name: str, args: argparse.Namespace, directory: Path) -> list[str]:
    ours, theirs = make(name, directory, args.quick)
    ids = torch.randint(0, SHAPES[name]["vocab_size"], (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    with torch.no_grad():
        diff = (logits_of(ours.eval(), ids) - logits_of(theirs.eval(), ids)).abs().max().item()
    now = clock(args.clock)
    ours_steps, theirs_steps = steps(ours, ids), steps(theirs, ids)
    for fn in (*ours_steps, *theirs_steps):  # warm-up (allocations, AdamW state)
        fn()
    rows = []
    for i, what in enumerate(("forward", "train step")):
        mine, yours = [], []
        for r in range(args.rounds):
            pair = [(mine, ours_steps[i]), (yours, theirs_steps[i])]
            for out, fn in pair if r % 2 == 0 else pair[::-1]:
                out.append(timed(fn, now))
        tokens = args.batch * (args.seq - (i == 1))
        ratios = [y / m for m, y in zip(mine, yours, strict=True)]
        rows.append(
            f"| {name} | {what} | {tokens / statistics.median(mine):,.0f} | "
            f"{tokens / statistics.median(yours):,.0f} | {quartiles(ratios)} |"
        )
    n = sum(p.numel() for p in ours.parameters())
    print(f"{name}: {n:,} parameters, max abs logit difference {diff:.1e}; spec: {ours.spec}")
    return rows


def profile(name: str, args: argparse.Namespace, directory: Path) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    ours, theirs = make(name, directory, args.quick)
    ids = torch.randint(0, SHAPES[name]["vocab_size"], (args.batch, args.seq))
    for label, model in (("lmcore", ours), ("transformers", theirs)):
        _, train = steps(model, ids)
        train()
        with prof(activities=[ProfilerActivity.CPU]) as p:
            train()
        print(f"== {label}")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--quick", action="store_true", help="2 layers, for a quick look")
    ap.add_argument("--profile", choices=sorted(SHAPES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        if args.profile:
            profile(args.profile, args, Path(tmp))
            return
        rows = [row for name in SHAPES for row in bench(name, args, Path(tmp))]
    print(f"\nbatch {args.batch} x seq {args.seq}, float32, {args.threads} thread(s), "
          f"{args.clock} clock, {args.rounds} rounds")  # fmt: skip
    print("| model | step | lmcore tokens/s | transformers tokens/s | lmcore / transformers |")
    print("| --- | --- | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
