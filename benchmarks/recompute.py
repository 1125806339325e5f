"""Activation recomputation (`--recompute`): the peak memory and the time of a training step with
and without it, in one run.

    python benchmarks/recompute.py [--spec "tinystories, context_length=4096"] [--batch 1]
                                   [--recompute layers] [--rounds 3] [--threads N]
                                   [--device cpu|cuda]

One training step: forward, next-token cross-entropy, backward and an AdamW step, on `--batch`
random sequences of the spec's full context (the tinystories preset at context 4,096 by
default: 1 × 4,096 tokens). Each variant (no recompute, then `--recompute WHAT` as `lmcore
train` applies it, `lmcore.model.recompute.apply_recompute`) runs in a fresh process of its
own: the model and AdamW are built, one warm-up step allocates AdamW's state, the gradients
are freed (`zero_grad(set_to_none=True)`), and then the peak is measured over `--rounds`
timed steps:

- on the CPU, the process's resident set from the kernel (`/proc/self/status`): VmRSS after
  the warm-up is the baseline (weights, AdamW state, the runtime), the high-water mark VmHWM,
  reset there (`/proc/self/clear_refs`), the peak; glibc's malloc runs with a fixed mmap
  threshold (`MALLOC_MMAP_THRESHOLD_`), so every large tensor is mapped and unmapped as it
  lives and dies, and the resident set follows the live tensors rather than malloc's cache;
- on CUDA, the caching allocator's `max_memory_allocated` after `reset_peak_memory_stats`,
  its `memory_allocated` the baseline.

"step peak" is the peak above the baseline: the gradients, the activations and the
temporaries of a step, what recomputation changes. Time: the median step, measured in a
third and fourth process with malloc as it is (under the fixed threshold every tensor is
mapped and faulted in anew, which slows a step several times, unequally). The table gives
both variants and the ratios recompute / none; `lmcore describe SPEC --recompute WHAT`'s
activation estimate beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lmcore.model.nn import cross_entropy
from lmcore.model.recompute import apply_recompute
from lmcore.model.transformer import TransformerLM

SPEC = "tinystories, context_length=4096"
MMAP_THRESHOLD = 64 * 1024  # bytes: glibc maps every allocation above it on its own
MIB = 2**20


def build(spec: str, recompute: str | None, device: str) -> TransformerLM:
    torch.manual_seed(0)
    model = TransformerLM(spec, device=device)
    if recompute is not None:
        apply_recompute(model, recompute)
    return model


def batch(model: TransformerLM, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    spec = model.spec
    x = torch.randint(0, spec.vocab_size, (size, spec.context_length + 1), generator=g)
    x = x.to(model.lm_head.weight.device)
    return x[:, :-1], x[:, 1:]


def gradients(spec: str, recompute: str | None, size: int = 1) -> dict[str, torch.Tensor]:
    """The gradients of one step's loss (what the tests compare between the variants)."""
    model = build(spec, recompute, "cpu")
    x, y = batch(model, size)
    cross_entropy(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _status(key: str) -> int:
    """A `/proc/self/status` line in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(spec: str, recompute: str | None, size: int, rounds: int, device: str) -> dict[str, Any]:
    """One variant, in this process: the baseline, the peak above it and the step times."""
    model = build(spec, recompute, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = batch(model, size)
    cuda = device.startswith("cuda")

    def step() -> None:
        cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    step()  # warm-up: AdamW's state now exists; the gradients are freed again
    if cuda:
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        baseline = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark := the RSS now
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if cuda else _status("VmHWM")
    return {"baseline": baseline, "peak": peak, "step_peak": peak - baseline,
            "seconds": statistics.median(times), "times": times}  # fmt: skip


def run_variant(args: argparse.Namespace, recompute: str | None) -> dict[str, Any]:
    """The variant's memory (`child` in a fresh process under the fixed mmap threshold) and its
    time (another fresh process, malloc as it is: mapping and faulting in every tensor anew
    makes a step several times slower, and not equally so for both variants)."""
    memory = _fresh(args, recompute, {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
    if args.device.startswith("cuda"):
        return memory
    timed = _fresh(args, recompute, {})
    return {**memory, "seconds": timed["seconds"], "times": timed["times"]}


def _fresh(
    args: argparse.Namespace, recompute: str | None, extra: dict[str, str]
) -> dict[str, Any]:
    """`child` in a fresh process (a clean allocator and high-water mark)."""
    cmd = [sys.executable, __file__, "--child", "--spec", args.spec, "--batch", str(args.batch),
           "--rounds", str(args.rounds), "--device", args.device]  # fmt: skip
    cmd += ["--recompute", recompute or "none"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | extra
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def estimate(spec: str, size: int, recompute: str | None) -> int:
    from lmcore.describe import describe

    activations = describe(spec, batch=size, recompute=recompute).memory.activations
    return activations or 0


def table(args: argparse.Namespace) -> list[str]:
    plain = run_variant(args, None)
    again = run_variant(args, args.recompute)
    unit = "allocated" if args.device.startswith("cuda") else "RSS"
    lines = [
        f"| variant | baseline {unit} MiB | peak {unit} MiB | step peak MiB | step s | "
        "describe's activations MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r, what in (("none", plain, None), (f"--recompute {args.recompute}", again,
                                                  args.recompute)):  # fmt: skip
        lines.append(
            f"| {name} | {r['baseline'] / MIB:,.0f} | {r['peak'] / MIB:,.0f} | "
            f"{r['step_peak'] / MIB:,.0f} | {r['seconds']:.2f} | "
            f"{estimate(args.spec, args.batch, what) / MIB:,.0f} |"
        )
    estimated = estimate(args.spec, args.batch, args.recompute) / estimate(
        args.spec, args.batch, None
    )
    lines.append(
        f"| recompute / none | {again['baseline'] / plain['baseline']:.2f} | "
        f"{again['peak'] / plain['peak']:.2f} | {again['step_peak'] / plain['step_peak']:.2f} | "
        f"{again['seconds'] / plain['seconds']:.2f} | "
        f"{estimated:.2f} |"
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", default=SPEC)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--recompute", default="layers", help="WHAT, as lmcore train takes it")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        what = None if args.recompute == "none" else args.recompute
        result = child(args.spec, what, args.batch, args.rounds, args.device)
        print(json.dumps(result))
        return
    print(f"{args.spec}: batch {args.batch}, {args.rounds} timed steps a variant, "
          f"{args.device}, torch {torch.__version__}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("\n".join(table(args)))


if __name__ == "__main__":
    main()
