"""Document-masked attention: `chunked` skipping the tiles across documents against the same
kernel given the dense document mask, and against `sdpa` with the dense mask, in one run.

    python benchmarks/docmask.py [--tokens 4096] [--documents 8] [--heads 16] [--head-dim 32]
                                 [--rounds 5] [--threads N] [--device cpu|cuda]

One training step of one attention layer's kernel: forward and backward of the attention
operator on q, k, v of one packed row (the tinystories preset's heads at context 4,096 by
default: 1 row × 4,096 tokens, 16 heads of 32, float32), the row made of `--documents` equal
documents (8 × 512 tokens). The projections around the kernel cost the same in every variant
and are left out, so the ratios are the kernel's own. Variants:

- `chunked, documents`: `documents=` the row's ids; each query block starts at its first
  query's document, so the tiles wholly in earlier documents are never computed;
- `chunked, dense mask`: the same kernel given the block-causal `(1, 1, T, T)` mask
  (`lmcore.model.documents.same_document`): every causal tile computed, then masked;
- `sdpa, dense mask`: `sdpa` given the documents, which it turns into that mask;
- `chunked, one document`: the row as one 4,096-token document (plain causal attention), what
  the row costs without documents.

Every variant gets the same inputs and output gradient; after one warm-up step each, the
variants take turns in each of `--rounds` rounds (so a shared machine's changing load falls on
all of them alike) and a step's time is the variant's median. The last column gives each
variant's time over the document-masked one's.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lmcore.model.documents import same_document
from lmcore.registry import get_registry

VARIANTS = ("chunked, documents", "chunked, dense mask", "sdpa, dense mask",
            "chunked, one document")  # fmt: skip


def inputs(
    tokens: int, documents: int, heads: int, head_dim: int, device: str, seed: int = 0
) -> dict[str, Tensor]:
    """q, k, v (leaves needing gradients), the output's gradient and the row's document ids."""
    if tokens % documents:
        raise SystemExit(f"--tokens {tokens} is not a multiple of --documents {documents}")
    g = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(1, heads, tokens, head_dim, generator=g) for _ in range(4))
    ids = torch.arange(documents).repeat_interleave(tokens // documents)[None]
    out = {"q": q, "k": k, "v": v, "grad": grad, "documents": ids}
    return {n: t.to(device).requires_grad_(n in "qkv") for n, t in out.items()}


def steps(x: dict[str, Tensor]) -> dict[str, Callable[[], list[Tensor]]]:
    """Each variant's step: the kernel's output and the gradients of q, k and v."""
    registry = get_registry()
    chunked = registry.get("attn", "chunked").component.create()
    sdpa = registry.get("attn", "sdpa").component.create()
    dense = same_document(x["documents"])

    def step(kernel: Any, **kw: Tensor) -> Callable[[], list[Tensor]]:
        def run() -> list[Tensor]:
            out = kernel(x["q"], x["k"], x["v"], causal=True, **kw)
            grads = torch.autograd.grad(out, (x["q"], x["k"], x["v"]), x["grad"])
            return [out.detach(), *grads]

        return run

    return dict(zip(VARIANTS, (
        step(chunked, documents=x["documents"]),
        step(chunked, mask=dense),
        step(sdpa, documents=x["documents"]),
        step(chunked),
    ), strict=True))  # fmt: skip


def timed(runs: dict[str, Callable[[], list[Tensor]]], rounds: int, cuda: bool) -> dict[str, float]:
    """Each variant's median step. The variants take turns within every round, so a change in
    the machine's load (a shared one) falls on all of them alike."""
    for run in runs.values():
        run()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def table(args: argparse.Namespace) -> list[str]:
    x = inputs(args.tokens, args.documents, args.heads, args.head_dim, args.device)
    seconds = timed(steps(x), args.rounds, args.device.startswith("cuda"))
    lines = ["| variant | step s | × chunked, documents |", "| --- | ---: | ---: |"]
    base = seconds[VARIANTS[0]]
    for name in VARIANTS:
        lines.append(f"| {name} | {seconds[name]:.3f} | {seconds[name] / base:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch's threads (0: its default)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"1 row × {args.tokens} tokens in {args.documents} documents, {args.heads} heads of "
          f"{args.head_dim}, float32, forward + backward, {args.rounds} timed steps a variant, "
          f"{args.device}, torch {torch.__version__}, {platform.machine()}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("\n".join(table(args)))


if __name__ == "__main__":
    main()
