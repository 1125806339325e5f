"""lmcore's from-scratch AdamW step (`--optimizer adamw`) against `torch.optim.AdamW(foreach=True)`
on the parameters of a preset's model (default `tinystories`), grouped by role as `lmcore
train` groups them (weight decay 0.1 on the matrices and the head).

    python benchmarks/adamw.py [--preset tinystories] [--rounds 9] [--repeat 5] [--threads N]
                               [--clock wall|cpu] [--device cpu|cuda]

First the updates: both optimizers take `--check-steps` steps from the same parameters on the
same random gradients, and the script reports the largest relative difference of their updates,
max over tensors of |Δ_lmcore - Δ_torch|∞ / |Δ_torch|∞ (Δ: the change since the start), and
fails above 1e-6. Then the time of one `step()` (gradients in place, nothing else), each
optimizer `--repeat` steps per round in rotating order. Prints a markdown table: median ms per
step and the median of the per-round ratios torch / lmcore with their quartiles (above 1:
lmcore is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import lmcore
from lmcore.model.roles import roles_of
from lmcore.train.config import TrainConfig, decay_roles
from lmcore.train.recipe import build_optimizer, param_groups, resolve_recipe

LR, WEIGHT_DECAY, BETAS, EPS = 1e-3, 0.1, (0.9, 0.95), 1e-8


def make_groups(
    preset: str, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[dict[str, Any]]:
    """The role groups of `preset`'s model, every parameter given a random gradient."""
    torch.manual_seed(seed)
    model = lmcore.build_model(preset, device=device, dtype=dtype)
    groups, _ = param_groups(model, roles_of(model), decay=decay_roles(TrainConfig().decay),
                             weight_decay=WEIGHT_DECAY, lr=LR, multipliers={})  # fmt: skip
    for g in groups:
        for p in g["params"]:
            p.grad = torch.randn_like(p)
    return groups


def twin(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of `groups`' parameters (the same gradient tensors: neither optimizer writes them)."""
    out = []
    for g in groups:
        params = []
        for p in g["params"]:
            q = torch.nn.Parameter(p.detach().clone())
            q.grad = p.grad
            params.append(q)
        out.append({**g, "params": params})
    return out


def lmcore_adamw(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    part = resolve_recipe("optimizer", "adamw")
    return build_optimizer(part, groups, lr=LR, weight_decay=WEIGHT_DECAY, betas=BETAS, eps=EPS)


def torch_adamw(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                             foreach=True)  # fmt: skip


def params_of(groups: list[dict[str, Any]]) -> list[Tensor]:
    return [p for g in groups for p in g["params"]]


def update_difference(groups: list[dict[str, Any]], steps: int) -> float:
    """The largest relative difference of lmcore's and torch's updates after `steps` steps."""
    ours, theirs, start = twin(groups), twin(groups), [p.detach().clone() for p in
                                                        params_of(groups)]  # fmt: skip
    opts = lmcore_adamw(ours), torch_adamw(theirs)
    for _ in range(steps):
        for opt in opts:
            opt.step()
    worst = 0.0
    for a, b, s in zip(params_of(ours), params_of(theirs), start, strict=True):
        moved = (b - s).abs().max().item()
        worst = max(worst, (a - b).abs().max().item() / moved)
    return worst


def seconds(fn: Callable[[], object], repeat: int, clock: Callable[[], float],
            sync: Callable[[], None]) -> float:  # fmt: skip
    sync()
    start = clock()
    for _ in range(repeat):
        fn()
    sync()
    return (clock() - start) / repeat


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="tinystories")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=5, help="steps per timing")
    parser.add_argument("--check-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    groups = make_groups(args.preset, args.device)
    diff = update_difference(groups, args.check_steps)
    if not diff <= 1e-6:
        raise SystemExit(f"the updates differ by {diff:.3g} relative, more than 1e-6")
    opts = {"lmcore adamw": lmcore_adamw(twin(groups)),
            "torch.optim.AdamW(foreach=True)": torch_adamw(twin(groups))}  # fmt: skip
    for opt in opts.values():
        opt.step()  # the state exists before timing
    times: dict[str, list[float]] = {k: [] for k in opts}
    for r in range(args.rounds):
        order = list(opts)
        order = order[r % len(order) :] + order[: r % len(order)]
        for k in order:
            times[k].append(seconds(opts[k].step, args.repeat, clock, sync))
    params = params_of(groups)
    where = torch.cuda.get_device_name() if cuda else f"cpu, {args.threads} threads"
    print(
        f"{args.preset}: {sum(p.numel() for p in params):,} parameters in {len(params)} tensors, "
        f"{len(groups)} role groups, float32, {where}, {args.rounds} rounds × {args.repeat} "
        f"steps, {args.clock} clock; updates after {args.check_steps} steps differ by at most "
        f"{diff:.2g} relative"
    )
    print()
    print("| optimizer | ms / step | torch / lmcore (quartiles) |")
    print("| --- | ---: | ---: |")
    mine = times["lmcore adamw"]
    for k, by in times.items():
        q1, q2, q3 = quartiles([t / m for m, t in zip(mine, by, strict=True)])
        print(f"| {k} | {1e3 * statistics.median(by):.2f} | {q2:.3f} ({q1:.3f}–{q3:.3f}) |")


if __name__ == "__main__":
    main()
