"""lmcore's mixture-of-experts layer against Hugging Face's Mixtral or DeepSeek-V3 block, on the
same weights.

    python benchmarks/moe.py [--rounds 7] [--tokens 2048] [--threads N] [--clock wall|cpu]
    python benchmarks/moe.py --peer deepseek_v3 --experts 64 --top-k 8 --n-group 8 --topk-group 4

`--peer mixtral` (the default): `ffn=moe(num_experts=8, top_k=2, renormalize=true)` (Mixtral's
routing, SwiGLU experts) as a model builds it, and transformers' `MixtralSparseMoeBlock` given
its router and expert weights. `--peer deepseek_v3`: DeepSeek-V3's routing, `ffn=moe(...,
score=sigmoid, n_group=G, topk_group=g, score_bias=true, renormalize=true, scale=2.5,
shared=swiglu, aux_loss_coef=0)` (sigmoid scores, group-limited top-k, a random score-correction
bias, one shared expert as wide as the routed ones, no load-balancing loss: DeepSeek-V3 balances
with the bias), and transformers' `DeepseekV3MoE` given the same router, bias, routed and shared
experts. The script checks that the outputs agree before timing. Each Hugging Face block runs
with its experts implementation `eager` (a loop over the experts hit: a block built on its own)
and `grouped_mm` (what a model built by transformers runs where torch has the kernel).

Timed in one process, each layer once per round in rotating order: the inference forward (no
gradients) and a training step (forward, a loss, backward; with Mixtral's routing lmcore also
computes its load-balancing loss and adds it, which the Hugging Face block leaves to the model
around it). Prints a markdown table: median ms of each and the median of the per-round ratios
Hugging Face / lmcore with their quartiles (above 1: lmcore is faster). On a machine shared with
other work, `--threads 1 --clock cpu` gives steadier ratios (the process's CPU time on one thread).
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


def deepseek_layer(
    d_model: int, d_ff: int, experts: int, top_k: int, n_group: int, topk_group: int,
    dtype: torch.dtype,
) -> MixtureOfExperts:  # fmt: skip
    """DeepSeek-V3's mixture as `build_model` builds it, with a random score-correction bias
    (zeros would leave the choice as without one)."""
    bp = lmcore.resolve(
        f"vocab_size=16, context_length=16, d_model={d_model}, num_layers=1, num_heads=1, "
        f"d_ff={d_ff}, ffn=moe(num_experts={experts}, top_k={top_k}, score=sigmoid, "
        f"n_group={n_group}, topk_group={topk_group}, score_bias=true, renormalize=true, "
        "scale=2.5, shared=swiglu, aux_loss_coef=0)"
    )
    layer = bp.create("ffn", dtype=dtype)
    assert isinstance(layer, MixtureOfExperts) and layer.score_bias is not None
    with torch.no_grad():
        layer.score_bias.copy_(torch.randn(experts) * 0.1)
    return layer


def _copy_experts(block: Any, layer: MixtureOfExperts) -> None:
    """lmcore's router and SwiGLU experts into a transformers 5 block, whose experts are 3-D
    tensors: `gate_up_proj[e] = [w1; w3]`, `down_proj[e] = w2`."""
    with torch.no_grad():
        block.gate.weight.copy_(layer.router.weight)
        for e, expert in enumerate(layer.experts):
            ex: Any = expert
            block.experts.gate_up_proj[e].copy_(torch.cat([ex.w1.weight, ex.w3.weight]))
            block.experts.down_proj[e].copy_(ex.w2.weight)


def deepseek_block(layer: MixtureOfExperts, experts: str | None = None) -> nn.Module:
    """transformers' `DeepseekV3MoE` holding `layer`'s router, score bias, routed experts and
    shared expert; `experts` its experts implementation ("eager": a loop over the experts hit,
    "grouped_mm": what a model built by transformers runs where torch has the kernel; None,
    a block built on its own: eager)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    first: Any = layer.experts[0]
    shared: Any = layer.shared
    assert shared is not None and layer.score_bias is not None
    config = DeepseekV3Config(
        hidden_size=layer.d_model,
        moe_intermediate_size=first.w1.weight.shape[0],
        n_routed_experts=layer.num_experts,
        num_experts_per_tok=layer.top_k,
        n_group=layer.n_group,
        topk_group=layer.topk_group,
        norm_topk_prob=layer.renormalize,
        routed_scaling_factor=layer.scale,
        n_shared_experts=shared.w1.weight.shape[0] // first.w1.weight.shape[0],
    )
    config._experts_implementation = experts
    block: Any = DeepseekV3MoE(config).to(layer.router.weight.dtype)
    _copy_experts(block, layer)
    with torch.no_grad():
        block.gate.e_score_correction_bias.copy_(layer.score_bias)
        block.shared_experts.gate_proj.weight.copy_(shared.w1.weight)
        block.shared_experts.up_proj.weight.copy_(shared.w3.weight)
        block.shared_experts.down_proj.weight.copy_(shared.w2.weight)
    module: nn.Module = block
    return module


def mixtral_block(layer: MixtureOfExperts, experts: str | None = None) -> nn.Module:
    """transformers' `MixtralSparseMoeBlock` holding `layer`'s router and experts (transformers
    5 keeps the experts as 3-D tensors: `gate_up_proj[e] = [w1; w3]`, `down_proj[e] = w2`),
    with `experts` its experts implementation as `deepseek_block`'s."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    first: Any = layer.experts[0]
    config = MixtralConfig(
        hidden_size=layer.d_model,
        intermediate_size=first.w1.weight.shape[0],
        num_local_experts=layer.num_experts,
        num_experts_per_tok=layer.top_k,
    )
    config._experts_implementation = experts
    block = MixtralSparseMoeBlock(config).to(layer.router.weight.dtype)
    _copy_experts(block, layer)
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
    parser.add_argument("--peer", choices=["mixtral", "deepseek_v3"], default="mixtral")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="calls per timing")
    parser.add_argument("--tokens", type=int, default=2048, help="batch × sequence")
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=1024, help="each expert's hidden width")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--n-group", type=int, default=1, help="deepseek_v3: expert groups")
    parser.add_argument("--topk-group", type=int, default=1, help="deepseek_v3: groups kept")
    parser.add_argument(
        "--hf-experts",
        nargs="+",
        choices=["eager", "grouped_mm"],
        default=["eager", "grouped_mm"],
        help="transformers' experts implementations to time (grouped_mm: a model's default)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.peer == "mixtral":
        ours = lmcore_layer(args.d_model, args.d_ff, args.experts, args.top_k, dtype)
        block, name, routing = mixtral_block, "MixtralSparseMoeBlock", ""
    else:
        ours = deepseek_layer(args.d_model, args.d_ff, args.experts, args.top_k, args.n_group,
                              args.topk_group, dtype)  # fmt: skip
        block, name = deepseek_block, "DeepseekV3MoE"
        routing = (f", sigmoid, {args.topk_group} of {args.n_group} groups, score bias, "
                   "scale 2.5, 1 shared expert")  # fmt: skip
    peers = {f"{name} {impl}": block(ours, impl) for impl in args.hf_experts}
    x = torch.randn(args.tokens // 256 or 1, min(args.tokens, 256), args.d_model, dtype=dtype)
    grad = torch.randn(x.shape)
    with torch.no_grad():
        for theirs in peers.values():
            torch.testing.assert_close(ours(x), theirs(x), rtol=2e-2, atol=2e-2)
    modules = {"lmcore": ours, **peers}
    passes = {
        "forward": {k: forward(m, x) for k, m in modules.items()},
        "training step": {k: training_step(m, x, grad) for k, m in modules.items()},
    }
    times = {p: {k: [] for k in modules} for p in passes}
    for r in range(args.rounds):
        for p, fns in passes.items():
            order = list(fns)
            order = order[r % len(order) :] + order[: r % len(order)]  # rotate who goes first
            for k in order:
                times[p][k].append(seconds(fns[k], args.repeat, clock))
    print(
        f"{x.shape[0]} × {x.shape[1]} tokens, d_model {args.d_model}, {args.experts} experts of "
        f"d_ff {args.d_ff}, top-{args.top_k}{routing}, {args.dtype}, {args.threads} threads, "
        f"{args.rounds} rounds, {args.clock} clock"
    )
    print()
    print("| pass | peer | lmcore ms | peer ms | × peer (quartiles) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for p, by in times.items():
        mine = by["lmcore"]
        for peer in peers:
            ratios = [t / m for m, t in zip(mine, by[peer], strict=True)]
            q1, q2, q3 = quartiles(ratios)
            print(
                f"| {p} | transformers {peer} | {1e3 * statistics.median(mine):.1f} | "
                f"{1e3 * statistics.median(by[peer]):.1f} | {q2:.2f} ({q1:.2f}–{q3:.2f}) |"
            )


if __name__ == "__main__":
    main()
