"""lmcore's mixture-of-experts layer against Hugging Face's Mixtral block, on the same weights.

    python benchmarks/moe.py [--rounds 7] [--tokens 2048] [--threads N] [--clock wall|cpu]

`ffn=moe(num_experts=8, top_k=2, renormalize=true)` (Mixtral's routing, SwiGLU experts) as a
model builds it, and transformers' `MixtralSparseMoeBlock` given its router and expert weights
(the script checks that their outputs agree before timing). Timed in one process, each layer
once per round in alternating order: the inference forward (no gradients) and a training step
(forward, a loss, backward; lmcore also computes its load-balancing loss and adds it, which the
Hugging Face block leaves to the model around it). Prints a markdown table: median ms of each
and the median of the per-round ratios Hugging Face / lmcore with their quartiles (above 1:
lmcore is faster). On a machine shared with other work, `--threads 1 --clock cpu` gives steadier
ratios (the process's CPU time on one thread).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

import lmcore
from lmcore.model.moe import MixtureOfExperts


def lmcore_layer(
    d_model: int, d_ff: int, experts: int, top_k: int, dtype: torch.dtype
) -> MixtureOfExperts:
    """The mixture exactly as `build_model` builds it for the spec's ffn slot."""
    bp = lmcore.resolve(
        f"vocab_size=16, context_length=16, d_model={d_model}, num_layers=1, num_heads=1, "
        f"d_ff={d_ff}, ffn=moe(num_experts={experts}, top_k={top_k}, renormalize=true)"
    )
    layer = bp.create("ffn", dtype=dtype)
    assert isinstance(layer, MixtureOfExperts)
    return layer


def mixtral_block(layer: MixtureOfExperts) -> nn.Module:
    """transformers' `MixtralSparseMoeBlock` holding `layer`'s router and experts (transformers
    5 keeps the experts as 3-D tensors: `gate_up_proj[e] = [w1; w3]`, `down_proj[e] = w2`)."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    first: Any = layer.experts[0]
    config = MixtralConfig(
        hidden_size=layer.d_model,
        intermediate_size=first.w1.weight.shape[0],
        num_local_experts=layer.num_experts,
        num_experts_per_tok=layer.top_k,
    )
    block = MixtralSparseMoeBlock(config).to(layer.router.weight.dtype)
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.weight)
        for e, expert in enumerate(layer.experts):
            ex: Any = expert
            block.experts.gate_up_proj[e].copy_(torch.cat([ex.w1.weight, ex.w3.weight]))
            block.experts.down_proj[e].copy_(ex.w2.weight)
    return block


def forward(module: nn.Module, x: Tensor) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return module(x)

    return run


def training_step(module: nn.Module, x: Tensor, grad: Tensor) -> Callable[[], object]:
    def run() -> object:
        module.zero_grad(set_to_none=True)
        loss = (module(x).float() * grad).sum()
        aux = getattr(module, "aux_loss", None)
        if isinstance(aux, Tensor):
            loss = loss + aux
        loss.backward()
        return loss

    return run


def seconds(fn: Callable[[], object], repeat: int, clock: Callable[[], float]) -> float:
    fn()  # warm-up
    start = clock()
    for _ in range(repeat):
        fn()
    return (clock() - start) / repeat


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="calls per timing")
    parser.add_argument("--tokens", type=int, default=2048, help="batch × sequence")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=1024, help="each expert's hidden width")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    ours = lmcore_layer(args.d_model, args.d_ff, args.experts, args.top_k, dtype)
    theirs = mixtral_block(ours)
    x = torch.randn(args.tokens // 256 or 1, min(args.tokens, 256), args.d_model, dtype=dtype)
    grad = torch.randn(x.shape)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=2e-2, atol=2e-2)
    cases = {
        "forward": (forward(ours, x), forward(theirs, x)),
        "training step": (training_step(ours, x, grad), training_step(theirs, x, grad)),
    }
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
    for r in range(args.rounds):
        for name, (mine, peer) in cases.items():
            pair = [(0, mine), (1, peer)] if r % 2 == 0 else [(1, peer), (0, mine)]
            for which, fn in pair:
                times[name][which].append(seconds(fn, args.repeat, clock))
    print(
        f"{x.shape[0]} × {x.shape[1]} tokens, d_model {args.d_model}, {args.experts} experts of "
        f"d_ff {args.d_ff}, top-{args.top_k}, {args.dtype}, {args.threads} threads, "
        f"{args.rounds} rounds, {args.clock} clock"
    )
    print()
    print("| pass | lmcore ms | Hugging Face ms | × Hugging Face (quartiles) |")
    print("| --- | ---: | ---: | ---: |")
    for name, (mine, peer) in times.items():
        ratios = [p / m for m, p in zip(mine, peer, strict=True)]
        q1, q2, q3 = quartiles(ratios)
        print(
            f"| {name} | {1e3 * statistics.median(mine):.1f} | "
            f"{1e3 * statistics.median(peer):.1f} | {q2:.2f} ({q1:.2f}–{q3:.2f}) |"
        )


if __name__ == "__main__":
    main()
