"""optimizer=adamw | torch_adamw: CS336's AdamW (Loshchilov & Hutter, 2019), written on
`torch.optim.Optimizer`'s base class.

Per parameter θ with gradient g, at step t (from 1), with the group's lr α and weight decay λ:

    θ ← θ - α λ θ                    (decoupled decay, first, as torch applies it)
    m ← β1 m + (1 - β1) g            v ← β2 v + (1 - β2) g²
    θ ← θ - α / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε)

that is CS336's `α_t = α sqrt(1 - β2^t) / (1 - β1^t)`, `θ ← θ - α_t m / (sqrt(v) + ε')` with
ε' = ε sqrt(1 - β2^t): the handout adds ε to the uncorrected `sqrt(v)`; here it is added to the
bias-corrected one, as `torch.optim.AdamW` does, and the ops run in the order of torch's
foreach path, so the two agree bit for bit. (CS336's own test accepts torch's weights or its
reference's, which differ by ~5e-6 after the test's 1000 steps.) The state per parameter is
`step` (a float32 CPU tensor), `exp_avg` and `exp_avg_sq`, as torch's. `torch_adamw` is
`torch.optim.AdamW` itself, fused where torch has the kernel: the faster choice on a GPU, and
the reference lmcore's tests hold `adamw` to.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lmcore import Component, hookimpl


class AdamW(torch.optim.Optimizer):
    """AdamW over `groups` (each may set its own lr and weight_decay), the moments kept in the
    parameter's dtype. The step runs per group with torch's `_foreach` ops over its
    parameters, one kernel per op for the whole group (per-tensor step sizes as scalar
    lists, no regrouping)."""

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
            params, grads, ms, vs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)  # on the CPU, as torch's: no sync to read
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if params:
                self._update(group, params, grads, ms, vs, steps)
        return loss

    @staticmethod
    def _update(
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        ms: list[Tensor],
        vs: list[Tensor],
        steps: list[Tensor],
    ) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        wd = group["weight_decay"]
        torch._foreach_add_(steps, 1)
        if wd != 0:
            torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_lerp_(ms, grads, 1 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, grads, grads, 1 - beta2)
        # Per tensor, as a parameter that missed a step's gradient has taken fewer steps; the
        # scalars and the order of the ops are torch's foreach path's, so the two agree bit
        # for bit (what its rounding leaves would otherwise be ~1e-4 of an update).
        ts = [s.item() for s in steps]
        step_size = [-(lr / (1 - beta1**t)) for t in ts]
        bias2_sqrt = [(1 - beta2**t) ** 0.5 for t in ts]
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bias2_sqrt)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, ms, denom, step_size)


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
            features=frozenset({"entrywise"}),
        ),
        Component(
            kind="optimizer",
            name="torch_adamw",
            build=build_torch,
            help="torch.optim.AdamW, fused where torch has the kernel (else foreach)",
            features=frozenset({"entrywise"}),
        ),
    ]
