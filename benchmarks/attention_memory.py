"""Peak memory and time of attn=chunked vs attn=sdpa, causal self-attention, forward only.

    python benchmarks/attention_memory.py                      # S = 512 … 8192, B=1, H=8, D=64
    python benchmarks/attention_memory.py --lengths 1024 4096 --block-size 256

`sdpa` materialises the (B, H, S, S) scores, so its memory grows with S²; `chunked` keeps one
(B, H, S, block) slice of scores at a time, so its memory grows with S.

Memory (CPU): every (kernel, S) runs in a fresh Python subprocess. After the imports, the inputs
and a small warm-up call, it reads the current resident set size (RSS, /proc/self/statm); after
one forward, the peak RSS (resource.getrusage ru_maxrss). The difference is the extra memory the
forward needed, its output included. The subprocess runs with MALLOC_MMAP_THRESHOLD_=64 KiB so
glibc hands every freed tensor buffer back to the OS at once and RSS tracks live tensors (the
default threshold grows after frees and keeps freed blocks resident). The `calibrate` line
allocates a known 256 MiB tensor the same way, to show the method's error. On CUDA
(--device cuda) torch's peak-allocated counter is used instead.

Time: a second fresh subprocess per (kernel, S), with the default allocator, reports the fastest
of --repeats forwards after a warm-up (the minimum is the least disturbed by other processes).
torch uses --threads CPU threads (default 1: on a shared machine more threads wait on each other
and the timings swing by 10x).

Never run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable

MiB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def child(kernel: str, seq: int, what: str, args: argparse.Namespace) -> dict[str, float]:
    """In this fresh process, measure `what` ("memory" or "time") of one configuration."""
    import torch

    from lmcore_chunked import ChunkedAttention
    from lmcore_sdpa import SDPA

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    def sync() -> None:  # wait for queued GPU work before reading a clock or a counter
        if device.type == "cuda":
            torch.cuda.synchronize()

    shape = (args.batch, args.heads, seq, args.head_dim)
    q, k, v = (torch.randn(shape, device=device) for _ in range(3))
    run: Callable[[], object]
    if kernel == "calibrate":
        run = lambda: torch.ones(256 * MiB // 4, device=device)  # noqa: E731  256 MiB, touched
    else:
        module = SDPA() if kernel == "sdpa" else ChunkedAttention(block_size=args.block_size)
        small = torch.randn(1, args.heads, 64, args.head_dim, device=device)
        with torch.no_grad():
            module(small, small, small, causal=True)  # warm-up: lazy library loading
        run = lambda: module(q, k, v, causal=True)  # noqa: E731

    with torch.no_grad():
        if what == "time":
            run()
            times = []
            for _ in range(args.repeats):
                sync()
                start = time.perf_counter()
                run()
                sync()
                times.append(time.perf_counter() - start)
            return {"ms": 1000 * min(times)}
        if device.type == "cuda":
            sync()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = run()
            sync()
            return {"mib": (torch.cuda.max_memory_allocated() - before) / MiB, "slack_mib": 0.0}
        before, peak_before = rss_bytes(), peak_rss_bytes()
        out = run()
        del out
        return {
            "mib": (peak_rss_bytes() - before) / MiB,
            # Growth below an earlier peak is invisible to ru_maxrss; this bounds what may hide.
            "slack_mib": max(0, peak_before - before) / MiB,
        }


def measure(kernel: str, seq: int, what: str, argv: list[str]) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", kernel, str(seq), what, *argv]
    env = dict(os.environ)
    if what == "memory":
        env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{kernel} at S={seq} ({what}) failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--child", nargs=3, metavar=("KERNEL", "SEQ", "WHAT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        kernel, seq, what = args.child
        print(json.dumps(child(kernel, int(seq), what, args)))
        return

    passthrough = [
        f"--batch={args.batch}", f"--heads={args.heads}", f"--head-dim={args.head_dim}",
        f"--block-size={args.block_size}", f"--repeats={args.repeats}", f"--device={args.device}",
        f"--threads={args.threads}",
    ]  # fmt: skip
    print(
        f"causal attention forward, float32, B={args.batch}, H={args.heads}, D={args.head_dim}, "
        f"chunked block_size={args.block_size}, device={args.device}, threads={args.threads}"
    )
    cal = measure("calibrate", args.lengths[0], "memory", passthrough)
    print(f"calibrate: a 256 MiB tensor measures {cal['mib']:.1f} MiB")
    header = (
        f"{'S':>6} {'scores MiB':>10} {'sdpa MiB':>9} {'chunked MiB':>11} {'mem ratio':>9} "
        f"{'sdpa ms':>9} {'chunked ms':>10} {'time ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for seq in args.lengths:
        mem = {
            kernel: measure(kernel, seq, "memory", passthrough) for kernel in ("sdpa", "chunked")
        }
        ms = {
            kernel: measure(kernel, seq, "time", passthrough)["ms"]
            for kernel in ("sdpa", "chunked")
        }
        scores = args.batch * args.heads * seq * seq * 4 / MiB  # one (B, H, S, S) float32 tensor
        print(
            f"{seq:>6} {scores:>10.0f} {mem['sdpa']['mib']:>9.1f} {mem['chunked']['mib']:>11.1f} "
            f"{mem['sdpa']['mib'] / max(mem['chunked']['mib'], 1e-9):>9.1f} "
            f"{ms['sdpa']:>9.1f} {ms['chunked']:>10.1f} {ms['chunked'] / ms['sdpa']:>10.2f}"
        )
        slack = max(m["slack_mib"] for m in mem.values())
        if slack > 1:
            print(f"{'':>6} (up to {slack:.1f} MiB of growth may hide under an earlier peak)")


if __name__ == "__main__":
    main()
