"""lmcore's from-scratch primitives against torch's fused ops, timed in the same run.

    python benchmarks/primitives.py [--threads N] [--dtype float32|bfloat16]

Prints a markdown table: median time of lmcore's op, of its torch peer, and the ratio
(lmcore / torch; above 1 means lmcore is slower). Shapes are those of the TinyStories model
(batch 8, 256 tokens, d_model 512, 16 heads, d_ff 1344).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import einsum
from torch.utils.benchmark import Timer

from lmcore.model.nn import Linear, scaled_dot_product_attention, softmax
from lmcore_ffn import SwiGLU
from lmcore_rmsnorm import RMSNorm
from lmcore_sdpa import SDPA


def median_ms(fn: Callable[[], object], threads: int) -> float:
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    return float(timer.blocked_autorange(min_run_time=1.0).median * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    B, T, d, H, d_ff = 8, 256, 512, 16, 1344
    D = d // H
    x = torch.randn(B, T, d, dtype=dtype)
    lin = Linear(d, d, dtype=dtype)
    norm = RMSNorm(d, dtype=dtype)
    ffn = SwiGLU(d, d_ff, dtype=dtype)
    q, k, v = (torch.randn(B, H, T, D, dtype=dtype) for _ in range(3))
    scores = torch.randn(B, H, T, T, dtype=dtype)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    kernel = SDPA()
    w1, w2, w3 = ffn.w1.weight, ffn.w2.weight, ffn.w3.weight

    cases: list[tuple[str, Callable[[], object], str, Callable[[], object]]] = [
        ("Linear: x @ W.T", lambda: lin(x), "F.linear", lambda: F.linear(x, lin.weight)),
        (
            "Linear via einops.einsum",
            lambda: einsum(x, lin.weight, "b t i, o i -> b t o"),
            "F.linear",
            lambda: F.linear(x, lin.weight),
        ),
        (
            "softmax",
            lambda: softmax(scores, -1),
            "torch.softmax",
            lambda: torch.softmax(scores, -1),
        ),
        ("RMSNorm", lambda: norm(x), "F.rms_norm", lambda: F.rms_norm(x, (d,), norm.weight, 1e-5)),
        (
            "SwiGLU",
            lambda: ffn(x),
            "F.linear + F.silu",
            lambda: F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2),
        ),
        (
            "scaled_dot_product_attention",
            lambda: scaled_dot_product_attention(q, k, v, causal),
            "F.scaled_dot_product_attention",
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=causal),
        ),
        (
            "attn=sdpa kernel (causal)",
            lambda: kernel(q, k, v, causal=True),
            "F.sdpa(is_causal=True)",
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        ),
    ]
    print(f"torch {torch.__version__}, {args.threads} threads, {args.dtype}, B={B} T={T} d={d}")
    print("| lmcore op | ms | torch peer | ms | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    with torch.no_grad():
        for name, ours, peer_name, peer in cases:
            a, b = median_ms(ours, args.threads), median_ms(peer, args.threads)
            print(f"| {name} | {a:.2f} | {peer_name} | {b:.2f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
