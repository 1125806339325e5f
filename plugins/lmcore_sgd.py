"""optimizer=sgd: stochastic gradient descent with momentum, dampening, Nesterov momentum and
L2 weight decay, written on `torch.optim.Optimizer`'s base class; equal to `torch.optim.SGD`
with the same options.

Per parameter θ with gradient g, with the group's lr α and weight decay λ, momentum μ and
dampening δ (as torch's SGD):

    g ← g + λ θ                          (L2: the decay joins the gradient, and the momentum)
    b ← g at the first step, else μ b + (1 - δ) g
    g ← g + μ b with nesterov, else b    (no buffer at all with μ = 0)
    θ ← θ - α g

Weight decay is torch's SGD's: an L2 term added to the gradient, not AdamW's decoupled
shrinking, so `--weight-decay` is that coefficient, per role as the run's groups set it.
`momentum` defaults to 0.9, not torch's 0: plain SGD barely trains a language model. SGD
takes no betas and no eps; `lmcore train` refuses `--betas` and `--eps` with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lmcore import Arg, Component, hookimpl


class SGD(torch.optim.Optimizer):
    """SGD over `groups` (each may set its own lr and weight_decay). Each step runs per group
    with torch's `_foreach` ops, one kernel per op for the group's parameters; the momentum
    buffer is the state `momentum_buffer`, as torch's."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.9,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ):
        _check(momentum, dampening, nesterov)
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening,
                    "nesterov": nesterov, "weight_decay": weight_decay}  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()  # type: ignore[misc]
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params)
        return loss

    def _update(self, group: dict[str, Any], params: list[Tensor]) -> None:
        lr, mu, damp, wd = group["lr"], group["momentum"], group["dampening"], group["weight_decay"]
        grads: list[Tensor] = [p.grad for p in params]  # type: ignore[misc]
        if wd != 0:
            grads = torch._foreach_add(grads, params, alpha=wd)  # never into p.grad itself
        if mu != 0:
            bufs, old_bufs, old_grads = [], [], []
            for p, g in zip(params, grads, strict=True):
                state = self.state[p]
                if "momentum_buffer" not in state:  # torch's first step: b = g, undamped
                    state["momentum_buffer"] = torch.clone(g).detach()
                else:
                    old_bufs.append(state["momentum_buffer"])
                    old_grads.append(g)
                bufs.append(state["momentum_buffer"])
            if old_bufs:
                torch._foreach_mul_(old_bufs, mu)
                torch._foreach_add_(old_bufs, old_grads, alpha=1 - damp)
            grads = torch._foreach_add(grads, bufs, alpha=mu) if group["nesterov"] else bufs
        torch._foreach_add_(params, grads, alpha=-lr)


def _check(momentum: float, dampening: float, nesterov: bool) -> None:
    if not momentum < 1:
        raise ValueError(f"momentum must be < 1, got {momentum!r}")
    if dampening > 1:
        raise ValueError(f"dampening must be at most 1, got {dampening!r}")
    if nesterov and (momentum == 0 or dampening != 0):
        raise ValueError(
            f"nesterov needs momentum > 0 and dampening 0; got momentum={momentum!r}, "
            f"dampening={dampening!r}"
        )


def build(
    groups: list[dict[str, Any]],
    lr: float,
    weight_decay: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
) -> SGD:
    return SGD(groups, lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov,
               weight_decay=weight_decay)  # fmt: skip


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="optimizer",
            name="sgd",
            build=build,
            args=(
                Arg("momentum", float, 0.9, "the momentum μ (0: plain SGD)", ge=0.0),
                Arg("dampening", float, 0.0, "δ: the buffer takes (1 - δ) g", ge=0.0),
                Arg("nesterov", bool, False, "Nesterov momentum (needs dampening 0)"),
            ),
            validate=_check,
            help="SGD with momentum (torch.optim.SGD's rules, from scratch): L2 weight decay, "
            "no betas or eps",
        )
    ]
