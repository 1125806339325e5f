"""lmcore's Muon step (`optimizer=muon`) against `torch.optim.Muon` on a model's hidden
matrices (its parameters of role `matrix`), with the same weights, gradients and options.

    python benchmarks/muon.py [--spec tinystories] [--rounds 5] [--repeat 1] [--steps 3]
        [--device cpu] [--threads N] [--clock wall|cpu]

Both optimise the same matrices from the same values with the same gradients (torch's
defaults: lr 0.02, weight decay 0.1, momentum 0.95, Nesterov, 5 Newton–Schulz steps). First
`--steps` steps of each from equal starts: the largest relative difference of their updates,
max |Δours - Δtorch| / max |Δtorch| over the matrices, is printed (0: equal). Then timed in one
process, each once per round in rotating order, `--repeat` steps per timing. Prints a markdown
table: median ms per step of each and the median of the per-round ratios torch / lmcore with
their quartiles (above 1: lmcore is faster). On a machine shared with other work,
`--threads 1 --clock cpu` gives steadier ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import lmcore
from lmcore.model.roles import MATRIX, roles_of
from lmcore.train.recipe import build_optimizer, param_groups, resolve_recipe

LR, WEIGHT_DECAY = 0.02, 0.1


def matrices(spec: str, device: str, seed: int = 0) -> list[nn.Parameter]:
    """The hidden matrices (role `matrix`) of the model `spec` builds, as fresh parameters."""
    torch.manual_seed(seed)
    model = lmcore.build_model(spec, device=device)
    roles = roles_of(model)
    return [nn.Parameter(p.detach().clone()) for n, p in model.named_parameters()
            if roles[n].name == "matrix"]  # fmt: skip


Optimizers = dict[str, tuple[torch.optim.Optimizer, list[nn.Parameter]]]


def optimizers(params: list[nn.Parameter]) -> Optimizers:
    """lmcore's muon and torch's Muon, each over its own copy of `params`."""
    ours = [nn.Parameter(p.detach().clone()) for p in params]
    theirs = [nn.Parameter(p.detach().clone()) for p in params]
    holder = nn.Module()
    holder.ws = nn.ParameterList(ours)
    roles = {f"ws.{i}": MATRIX for i in range(len(ours))}
    groups, _ = param_groups(holder, roles, decay=("matrix",), weight_decay=WEIGHT_DECAY, lr=LR,
                             multipliers={})  # fmt: skip
    mine = build_optimizer(resolve_recipe("optimizer", "muon"), groups, lr=LR,
                           weight_decay=WEIGHT_DECAY, betas=(0.9, 0.95), eps=1e-8)  # fmt: skip
    peer = torch.optim.Muon(theirs, lr=LR, weight_decay=WEIGHT_DECAY)
    return {"lmcore": (mine, ours), "torch": (peer, theirs)}


def gradients(params: list[nn.Parameter], step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=gen).to(p.device) for p in params]


def max_relative_difference(params: list[nn.Parameter], steps: int) -> float:
    """Both optimizers `steps` steps from the same start on the same gradients: the largest
    difference of their updates relative to the largest update."""
    opts = optimizers(params)
    starts = [p.detach().clone() for p in params]
    for step in range(steps):
        grads = gradients(params, step)
        for opt, ps in opts.values():
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.clone()
            opt.step()
    (_, ours), (_, theirs) = opts["lmcore"], opts["torch"]
    worst = 0.0
    for a, b, s in zip(ours, theirs, starts, strict=True):
        da, db = a.detach() - s, b.detach() - s
        worst = max(worst, float((da - db).abs().max() / db.abs().max()))
    return worst


def stepper(opt: torch.optim.Optimizer, device: str) -> Callable[[], None]:
    def run() -> None:
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    return run


def seconds(fn: Callable[[], object], repeat: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(repeat):
        fn()
    return (clock() - start) / repeat


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def shapes(params: list[nn.Parameter]) -> str:
    counts: dict[tuple[int, ...], int] = {}
    for p in params:
        counts[tuple(p.shape)] = counts.get(tuple(p.shape), 0) + 1
    return ", ".join(f"{n}×{'×'.join(map(str, s))}" for s, n in counts.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", default="tinystories")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=1, help="steps per timing")
    parser.add_argument("--steps", type=int, default=3, help="steps compared for equality")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    params = matrices(args.spec, args.device)
    difference = max_relative_difference(params, args.steps)
    opts = optimizers(params)
    for opt, ps in opts.values():  # gradients in place, and a warm-up step (momentum buffers)
        for p, g in zip(ps, gradients(params, 0), strict=True):
            p.grad = g
        opt.step()
    fns = {name: stepper(opt, args.device) for name, (opt, _) in opts.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(args.rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            times[name].append(seconds(fns[name], args.repeat, clock))
    print(
        f"{args.spec}: {len(params)} hidden matrices ({shapes(params)}), "
        f"{sum(p.numel() for p in params):,} weights, float32 on {args.device}, "
        f"{args.threads} threads, {args.rounds} rounds × {args.repeat} step(s), {args.clock} clock"
    )
    print()
    print(
        "| step | lmcore ms | torch.optim.Muon ms | × torch (quartiles) | max relative difference |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    ratios = [t / m for m, t in zip(times["lmcore"], times["torch"], strict=True)]
    q1, q2, q3 = quartiles(ratios)
    mine, theirs = (statistics.median(times[n]) * 1e3 for n in ("lmcore", "torch"))
    print(
        f"| Muon | {mine:.1f} | {theirs:.1f} | {q2:.2f}× ({q1:.2f}–{q3:.2f}) | {difference:.1e} |"
    )


if __name__ == "__main__":
    main()
