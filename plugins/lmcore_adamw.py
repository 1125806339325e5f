"""optimizer=adamw | torch_adamw: CS336's AdamW (Loshchilov & Hutter, 2019), written on
`torch.optim.Optimizer`'s base class.

Per parameter θ with gradient g, at step t (from 1), with the group's lr α and weight decay λ:

    θ ← θ - α λ θ                    (decoupled decay, first, as torch applies it)
    m ← β1 m + (1 - β1) g            v ← β2 v + (1 - β2) g²
    α_t = α · sqrt(1 - β2^t) / (1 - β1^t)
    θ ← θ - α_t m / (sqrt(v) + ε sqrt(1 - β2^t))

CS336's handout writes the last denominator `sqrt(v) + ε`; here ε is added to the
bias-corrected `sqrt(v / (1 - β2^t))`, as `torch.optim.AdamW` does, so the two agree to 1e-6
(CS336's own test compares against torch's). The state per parameter is `step`, `exp_avg` and
`exp_avg_sq`, as torch's. `torch_adamw` is `torch.optim.AdamW` itself, fused where torch
has the kernel: the faster choice on a GPU, and the reference lmcore's tests hold `adamw` to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lmcore import Component, hookimpl


class AdamW(torch.optim.Optimizer):
    """AdamW over `groups` (each may set its own lr and weight_decay), the moments kept in the
    parameter's dtype. The step runs per group with torch's `_foreach` ops over its
    parameters, one kernel per op for the whole group."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()  # type: ignore[misc]
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, ms, vs = [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
            if params:
                self._update(group, params, grads, ms, vs)
        return loss

    def _update(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        ms: list[Tensor],
        vs: list[Tensor],
    ) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        # Every parameter of a group has taken the same number of steps unless some had no
        # gradient at some step: group them by their step count.
        by_step: dict[float, list[int]] = {}
        for i, p in enumerate(params):
            by_step.setdefault(float(self.state[p]["step"]), []).append(i)
        for t, idx in by_step.items():
            ps = [params[i] for i in idx]
            gs = [grads[i] for i in idx]
            m = [ms[i] for i in idx]
            v = [vs[i] for i in idx]
            if wd != 0:
                torch._foreach_mul_(ps, 1 - lr * wd)
            torch._foreach_lerp_(m, gs, 1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, gs, gs, 1 - beta2)
            step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
            denom = torch._foreach_sqrt(v)
            torch._foreach_add_(denom, eps * math.sqrt(1 - beta2**t))
            torch._foreach_addcdiv_(ps, m, denom, -step_size)


def build(
    groups: list[dict[str, Any]],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> AdamW:
    return AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def build_torch(
    groups: list[dict[str, Any]],
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> torch.optim.AdamW:
    """torch's own AdamW: fused where torch has the kernel for the parameters' device and
    dtype, else foreach."""
    common: dict[str, Any] = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
    try:
        return torch.optim.AdamW(groups, fused=True, **common)
    except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, foreach=True, **common)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="optimizer",
            name="adamw",
            build=build,
            help="AdamW (CS336's, from scratch): the run's betas and eps, decoupled weight decay",
        ),
        Component(
            kind="optimizer",
            name="torch_adamw",
            build=build_torch,
            help="torch.optim.AdamW, fused where torch has the kernel (else foreach)",
        ),
    ]
