"""What `lmcore train`'s runner costs over a minimal plain-PyTorch training loop, in one process.

    python benchmarks/train_overhead.py [--data DIR] [--steps 40] [--tiny-steps 300]
                                        [--repeats 8] [--threads N]

Both loops train the same model (same spec, seed and batch size) on the same token data:

- bare: the loop of CS336 or nanoGPT written out: `get_batch` from the memmap, forward,
  `cross_entropy`, backward, `clip_grad_norm_`, fused AdamW at the cosine learning rate,
  nothing else;
- runner: `lmcore.train.trainer.train` with evaluation and checkpoints at the ends only (it still
  evaluates once before and once after, saves one checkpoint, writes metrics every 10 steps,
  draws the loss curve).

Two models: the quickstart's (1.3M parameters, batch 16 × 128), and a tiny one (batch 8 × 16)
whose steps take milliseconds, so that the runner's own work per step shows. The loops run
interleaved (bare, runner, then runner, bare, ...) so that both see the same machine load; the
table gives the median of each, the median and range of the runner/bare ratio of each pair,
and the difference per step. "steps" is the time of the training steps alone (the first step
included); "whole call" adds set-up, the two evaluations, the checkpoint and the plot.
Default data: `data/stdlib-2k` from `lmcore quickstart` (prepared on first use).
Never run by the test suite.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import lmcore
from lmcore.data import TokenData, get_batch, prepare
from lmcore.model.nn import cross_entropy
from lmcore.train.config import TrainConfig, cosine_lr
from lmcore.train.quickstart import (
    EXCLUDE,
    QUICKSTART_DATA,
    QUICKSTART_SPEC,
    QUICKSTART_VOCAB,
    stdlib,
)
from lmcore.train.trainer import train


def bare(spec: str, data: TokenData, steps: int, batch: int, seed: int) -> tuple[float, float]:
    """(seconds of the steps, seconds of the whole call) of a minimal loop."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = lmcore.build_model(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)  # fmt: skip
    T = model.spec.context_length
    warmup = round(0.1 * steps)
    g = torch.Generator().manual_seed(seed)
    t1 = time.perf_counter()
    for step in range(steps):
        lr = cosine_lr(step + 1, lr=1e-3, min_lr=1e-4, warmup=warmup, decay_steps=steps)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = get_batch(data.train, batch, T, "cpu", generator=g)
        loss = cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
    float(loss.detach())  # the last loss, as a loop would print it
    t2 = time.perf_counter()
    return t2 - t1, t2 - t0


def runner(
    spec: str, data: TokenData, steps: int, batch: int, seed: int, work: Path
) -> tuple[float, float]:
    """(seconds of the steps as the runner clocks them, seconds of the whole call)."""
    t0 = time.perf_counter()
    cfg = TrainConfig(steps=steps, batch_size=batch, seed=seed, eval_every=0, eval_batches=1,
                      save_every=0, device="cpu")  # fmt: skip
    result = train(spec, data, Path(tempfile.mkdtemp(dir=work)), cfg, echo=None, progress=False)
    return result.train_seconds, time.perf_counter() - t0


TINY_SPEC = "vocab_size=2048, context_length=16, d_model=32, num_layers=2, num_heads=2"


def measure(
    spec: str, data: TokenData, steps: int, batch: int, repeats: int, work: Path
) -> dict[str, list[tuple[float, float]]]:
    """Interleaved repeats of both loops: {loop: [(steps s, whole s), ...]}."""
    bare(spec, data, 3, batch, 0)  # warm up: lazy imports, allocator
    times: dict[str, list[tuple[float, float]]] = {"bare": [], "runner": []}
    for r in range(repeats):
        for name in ("bare", "runner") if r % 2 == 0 else ("runner", "bare"):
            if name == "bare":
                t = bare(spec, data, steps, batch, 0)
            else:
                t = runner(spec, data, steps, batch, 0, work)
            times[name].append(t)
            print(f"  {name:<6} steps {t[0]:7.2f} s  whole {t[1]:7.2f} s", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=QUICKSTART_DATA)
    parser.add_argument("--steps", type=int, default=40, help="of the quickstart model")
    parser.add_argument("--tiny-steps", type=int, default=300, help="of the tiny model")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.data / "meta.json").is_file():
        prepare([stdlib()], args.data, vocab_size=QUICKSTART_VOCAB, extensions=(".py",),
                exclude=EXCLUDE)  # fmt: skip
    data = TokenData.open(args.data)
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}, {args.repeats} repeats")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, spec, batch, steps in (
            ("quickstart", QUICKSTART_SPEC, 16, args.steps),
            ("tiny", TINY_SPEC, 8, args.tiny_steps),
        ):
            T = lmcore.parse_spec(spec).context_length
            print(f"{name}: {spec}; {steps} steps × batch {batch} × {T} tokens")
            times = measure(spec, data, steps, batch, args.repeats, Path(work))
            rows.append((name, spec, batch, steps, T, times))
    print()
    print(
        "| model | steps × batch × seq | bare: median s | runner: median s | runner/bare, "
        "median of pairs (range) | runner − bare per step | whole call runner/bare |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")  # fmt: skip
    for name, _spec, batch, steps, T, times in rows:
        b = statistics.median(t[0] for t in times["bare"])
        r = statistics.median(t[0] for t in times["runner"])
        pairs = [x[0] / y[0] for x, y in zip(times["runner"], times["bare"], strict=True)]
        whole = [x[1] / y[1] for x, y in zip(times["runner"], times["bare"], strict=True)]
        print(f"| {name} | {steps} × {batch} × {T} | {b:.2f} | {r:.2f} | "
              f"{statistics.median(pairs):.3f} ({min(pairs):.2f}–{max(pairs):.2f}) | "
              f"{1000 * (r - b) / steps:+.2f} ms ({100 * (r - b) / b:+.1f}%) | "
              f"{statistics.median(whole):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
