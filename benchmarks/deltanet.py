"""lmcore's chunked gated delta rule against the torch implementations of its peers, on the same
inputs.

    python benchmarks/deltanet.py [--rounds 7] [--batch 1] [--seq 2048] [--heads 4]
        [--head-dim 128] [--chunk 64] [--threads N] [--clock wall|cpu]

Peers: transformers' `torch_chunk_gated_delta_rule` (what `Qwen3NextGatedDeltaNet` runs
without flash-linear-attention) and, where flash-linear-attention is importable (PyPI
`flash-linear-attention`; its kernels need triton, its pure-torch reference does not, so the
script loads `fla/ops/gated_delta_rule/naive.py` from the installed package without
importing the package), its `naive_chunk_gated_delta_rule`. All get the same L2-normalised q
and k, v, decays and β, in float32, chunks of `--chunk`, no initial state, the final state
returned; the script checks that their outputs agree before timing. Timed in one process,
each implementation once per round in rotating order: the forward (no gradients) and a
training step (forward, a loss on the outputs, backward to q, k, v, g and β). Prints a
markdown table: median ms of each and the median of the per-round ratios peer / lmcore with
their quartiles (above 1: lmcore is faster). On a machine shared with other work,
`--threads 1 --clock cpu` gives steadier ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from lmcore.model.deltanet import chunk_gated_delta_rule

Rule = Callable[..., tuple[Tensor, Tensor | None]]


def lmcore_rule(chunk: int) -> Rule:
    def run(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        return chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=chunk)

    return run


def transformers_rule(chunk: int) -> Rule:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    def run(
        q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        out: tuple[Tensor, Tensor | None] = torch_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=chunk, output_final_state=True
        )
        return out

    return run


def fla_naive() -> ModuleType | None:
    """flash-linear-attention's pure-torch reference module, or None where it is not installed.
    Importing `fla` itself would import triton (its kernels); the reference needs only torch
    and einops, so it is loaded from its file."""
    found = importlib.util.find_spec("fla")
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / "ops" / "gated_delta_rule"
    spec = importlib.util.spec_from_file_location("fla_gdr_naive", path / "naive.py")
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fla_rule(naive: ModuleType, chunk: int) -> Rule:
    def run(
        q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        out: tuple[Tensor, Tensor | None] = naive.naive_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=chunk, output_final_state=True
        )
        return out

    return run


def make_inputs(batch: int, seq: int, heads: int, dim: int, seed: int = 0) -> list[Tensor]:
    """q, k (unit norm per head, as the layer gives them), v, g (log decays as Qwen3-Next's
    gate makes them, about -0.05 to -1 per token) and β."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads, dim, generator=gen)
    k = torch.randn(batch, seq, heads, dim, generator=gen)
    q, k = (t * torch.rsqrt(t.square().sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    v = torch.randn(batch, seq, heads, dim, generator=gen)
    g = -torch.empty(batch, seq, heads).uniform_(0.05, 1.0, generator=gen)
    beta = torch.rand(batch, seq, heads, generator=gen)
    return [q, k, v, g, beta]


def forward(rule: Rule, xs: list[Tensor]) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return rule(*xs)[0]

    return run


def training_step(rule: Rule, xs: list[Tensor], grad: Tensor) -> Callable[[], object]:
    leaves = [x.clone().requires_grad_(True) for x in xs]

    def run() -> object:
        for x in leaves:
            x.grad = None
        loss = (rule(*leaves)[0] * grad).sum()
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


def peers(chunk: int) -> dict[str, Rule]:
    found = {"transformers": transformers_rule(chunk)}
    naive = fla_naive()
    if naive is not None:
        found["flash-linear-attention naive"] = fla_rule(naive, chunk)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=2, help="calls per timing")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128, help="d_k = d_v (Qwen3-Next: 128)")
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    xs = make_inputs(args.batch, args.seq, args.heads, args.head_dim)
    grad = torch.randn(args.batch, args.seq, args.heads, args.head_dim)
    ours = lmcore_rule(args.chunk)
    others = peers(args.chunk)
    with torch.no_grad():
        want, want_state = ours(*xs)
        for name, rule in others.items():
            got, state = rule(*xs)
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=name)
            torch.testing.assert_close(state, want_state, rtol=1e-3, atol=1e-3, msg=name)
    rules = {"lmcore": ours, **others}
    cases = {
        "forward": {n: forward(r, xs) for n, r in rules.items()},
        "training step": {n: training_step(r, xs, grad) for n, r in rules.items()},
    }
    times = {case: {n: [] for n in rules} for case in cases}  # type: dict[str, dict[str, list[float]]]
    names = list(rules)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for case, fns in cases.items():
            for name in order:
                times[case][name].append(seconds(fns[name], args.repeat, clock))
    print(
        f"batch {args.batch} × {args.seq} tokens, {args.heads} heads of d_k = d_v = "
        f"{args.head_dim}, chunks of {args.chunk}, float32, {args.threads} threads, "
        f"{args.rounds} rounds, {args.clock} clock"
        + ("" if len(others) > 1 else "; flash-linear-attention not installed")
    )
    print()
    print("| pass | peer | lmcore ms | peer ms | × peer (quartiles) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for case, by_name in times.items():
        mine = by_name["lmcore"]
        for name in others:
            ratios = [p / m for m, p in zip(mine, by_name[name], strict=True)]
            q1, q2, q3 = quartiles(ratios)
            print(
                f"| {case} | {name} | {1e3 * statistics.median(mine):.1f} | "
                f"{1e3 * statistics.median(by_name[name]):.1f} | {q2:.2f} ({q1:.2f}–{q3:.2f}) |"
            )


if __name__ == "__main__":
    main()
