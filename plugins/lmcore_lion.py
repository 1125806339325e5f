"""optimizer=lion: Lion, EvoLved Sign Momentum (Chen et al., 2023, "Symbolic Discovery of
Optimization Algorithms"), written on `torch.optim.Optimizer`'s base class.

Per parameter θ with gradient g, with the group's lr α and weight decay λ:

    c ← β1 m + (1 - β1) g               (the update's interpolation)
    θ ← θ (1 - α λ) - α sign(c)         (decoupled decay, as the paper's Program 1)
    m ← β2 m + (1 - β2) g               (the momentum, tracked with the other beta)

Lion's betas are its own arguments, `lion(beta1=0.9, beta2=0.99)` (the paper's defaults),
not the run's `--betas`: AdamW's (0.9, 0.95) mean something else here, so `lmcore train`
refuses `--betas` (and `--eps`, which Lion has none of) with it. Every coordinate moves by
±α, so the paper takes α 3-10× smaller and λ 3-10× larger than AdamW's. The state per
parameter is `exp_avg` (m), as `lion-pytorch`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lmcore import Arg, Component, hookimpl


class Lion(torch.optim.Optimizer):
    """Lion over `groups` (each may set its own lr and weight_decay), the momentum kept in the
    parameter's dtype. Each step runs per group with torch's `_foreach` ops, one kernel per op
    for the group's parameters."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ):
        _check(*betas)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()  # type: ignore[misc]
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, ms = [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                ms.append(state["exp_avg"])
            if params:
                self._update(group, params, grads, ms)
        return loss

    @staticmethod
    def _update(
        group: dict[str, Any], params: list[Tensor], grads: list[Tensor], ms: list[Tensor]
    ) -> None:
        lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
        update = torch._foreach_lerp(ms, grads, 1 - beta1)  # β1 m + (1 - β1) g, m untouched
        torch._foreach_sign_(update)
        if wd != 0:
            torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_add_(params, update, alpha=-lr)
        torch._foreach_lerp_(ms, grads, 1 - beta2)


def _check(beta1: float, beta2: float) -> None:
    for name, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0 <= beta < 1:
            raise ValueError(f"{name} must be in [0, 1), got {beta!r}")


def build(
    groups: list[dict[str, Any]], lr: float, weight_decay: float, beta1: float, beta2: float
) -> Lion:
    return Lion(groups, lr=lr, betas=(beta1, beta2), weight_decay=weight_decay)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="optimizer",
            name="lion",
            build=build,
            args=(
                Arg("beta1", float, 0.9, "the update's mix of momentum and gradient", ge=0.0),
                Arg("beta2", float, 0.99, "the momentum's decay", ge=0.0),
            ),
            validate=_check,
            help="Lion (Chen et al., 2023, from scratch): sign of interpolated momentum, "
            "decoupled weight decay; its own betas, no eps",
            features=frozenset({"entrywise"}),  # a sign per entry: muP's Adam rules hold
        )
    ]
