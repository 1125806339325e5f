"""optimizer=adafactor for lmcore: Adafactor (Shazeer & Stern, 2018, "Adafactor: Adaptive
Learning Rates with Sublinear Memory Cost"), written from scratch on `torch.optim.Optimizer`.

Per parameter X with gradient G, at step t (from 1), in float32 whatever X's dtype:

    β̂2 = 1 - t^(-decay_rate)
    matrix roles (factored):  R ← β̂2 R + (1 - β̂2) mean over fan_in of (G² + ε1)
                              C ← β̂2 C + (1 - β̂2) mean over fan_out of (G² + ε1)
                              V̂ = R C / mean over fan_out of R
    other roles:              V̂ ← β̂2 V̂ + (1 - β̂2) (G² + ε1)
    U = G / sqrt(V̂);   Û = U / max(1, RMS(U) / clip)
    ρ = group lr  (relative_step: min(1e-2, 1/sqrt(t)) · group lr / peak lr)
    α = max(ε2, RMS(X)) ρ  (scale_parameter; else ρ)
    X ← X (1 - ρ λ) - α Û   (with beta1 > 0: Û replaced by its running mean m ← β1 m + (1-β1) Û)

A parameter is factored when lmcore says it is a matrix: its group (one role, from the model's
parameter roles) has `fan_in` and `fan_out` axes, which may be any two of its dimensions, the
others a batch (stacked experts). Gains, biases and scalars keep a full second moment.

The step size follows the runner's learning rate (its schedule, warmup and `--role-lr`):
`relative_step=true` gives the paper's relative step at the schedule's peak and scales it by the
schedule from there, so that a warmup still warms up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from lmcore import Arg, Component, hookimpl

__all__ = ["Adafactor", "build", "lmcore_components"]


class Adafactor(torch.optim.Optimizer):
    """Adafactor over `groups` (lmcore's, by role: each group's `fan_in` / `fan_out` say whether
    and along which axes its parameters are factored; without them, nothing is)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        *,
        weight_decay: float = 0.0,
        beta1: float = 0.0,
        decay_rate: float = 0.8,
        clip: float = 1.0,
        eps1: float = 1e-30,
        eps2: float = 1e-3,
        relative_step: bool = False,
        scale_parameter: bool = True,
        factored: bool = True,
    ):
        defaults = {"lr": lr, "peak_lr": lr, "weight_decay": weight_decay, "beta1": beta1,
                    "decay_rate": decay_rate, "clip": clip, "eps1": eps1, "eps2": eps2,
                    "relative_step": relative_step, "scale_parameter": scale_parameter,
                    "factored": factored}  # fmt: skip
        super().__init__(params, defaults)

    @staticmethod
    def axes(group: dict[str, Any], p: Tensor) -> tuple[int, int] | None:
        """(fan_out, fan_in) as non-negative axes when `p` is factored, else None."""
        fan_in, fan_out = group.get("fan_in"), group.get("fan_out")
        if not group["factored"] or fan_in is None or fan_out is None or p.ndim < 2:
            return None
        return fan_out % p.ndim, fan_in % p.ndim

    @torch.no_grad()  # type: ignore[misc]
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(group, p)
        return loss

    def _update(self, group: dict[str, Any], p: Tensor) -> None:
        state = self.state[p]
        axes = self.axes(group, p)
        if not state:
            state["step"] = torch.tensor(0.0)
            if axes is None:
                state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            else:
                row, col = axes
                state["exp_avg_sq_row"] = p.new_zeros(p.shape, dtype=torch.float32).mean(
                    dim=col, keepdim=True
                )
                state["exp_avg_sq_col"] = p.new_zeros(p.shape, dtype=torch.float32).mean(
                    dim=row, keepdim=True
                )
            if group["beta1"] > 0:
                state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        state["step"] += 1
        t = float(state["step"])
        g, x = p.grad.float(), p.float()
        beta2 = 1 - t ** (-group["decay_rate"])
        sq = g.square() + group["eps1"]
        if axes is None:
            v = state["exp_avg_sq"].mul_(beta2).add_(sq, alpha=1 - beta2)
            u = g / v.sqrt()
        else:
            row, col = axes
            r, c = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
            r.mul_(beta2).add_(sq.mean(dim=col, keepdim=True), alpha=1 - beta2)
            c.mul_(beta2).add_(sq.mean(dim=row, keepdim=True), alpha=1 - beta2)
            u = g * (r / r.mean(dim=row, keepdim=True)).rsqrt() * c.rsqrt()
        u = u / (rms(u) / group["clip"]).clamp(min=1.0)
        if group["beta1"] > 0:
            u = state["exp_avg"].mul_(group["beta1"]).add_(u, alpha=1 - group["beta1"])
        rho = group["lr"]
        if group["relative_step"]:
            peak = group["peak_lr"]
            rho = min(1e-2, 1 / math.sqrt(t)) * (rho / peak if peak else 0.0)
        alpha = rho * max(group["eps2"], float(rms(x))) if group["scale_parameter"] else rho
        if group["weight_decay"] != 0:
            x = x * (1 - rho * group["weight_decay"])
        p.copy_(x - alpha * u)


def rms(t: Tensor) -> Tensor:
    return t.square().mean().sqrt()


def _check(beta1: float) -> None:
    if beta1 >= 1:
        raise ValueError(f"beta1 is a running mean's decay, below 1; got {beta1!r}")


def build(
    groups: list[dict[str, Any]],
    lr: float,
    weight_decay: float,
    beta1: float,
    decay_rate: float,
    clip: float,
    eps1: float,
    eps2: float,
    relative_step: bool,
    scale_parameter: bool,
    factored: bool,
) -> Adafactor:
    return Adafactor(groups, lr, weight_decay=weight_decay, beta1=beta1, decay_rate=decay_rate,
                     clip=clip, eps1=eps1, eps2=eps2, relative_step=relative_step,
                     scale_parameter=scale_parameter, factored=factored)  # fmt: skip


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="optimizer",
            name="adafactor",
            build=build,
            args=(
                Arg("beta1", float, 0.0, "first-moment decay (0: none, the paper's)", ge=0.0),
                Arg("decay_rate", float, 0.8, "second-moment decay: 1 - t^-decay_rate", gt=0.0),
                Arg("clip", float, 1.0, "update clipping threshold d: RMS(update) <= d", gt=0.0),
                Arg("eps1", float, 1e-30, "added to the squared gradient", gt=0.0),
                Arg("eps2", float, 1e-3, "the smallest parameter scale", ge=0.0),
                Arg(
                    "relative_step",
                    bool,
                    False,
                    "step min(1e-2, 1/sqrt(t)) at the schedule's peak, scaled by it",
                ),
                Arg("scale_parameter", bool, True, "step relative to the parameter's RMS"),
                Arg("factored", bool, True, "factored second moments for matrix roles"),
            ),
            help="Adafactor (Shazeer & Stern, 2018): factored second moments for matrices",
            validate=_check,
        )
    ]
