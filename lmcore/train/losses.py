"""The loss a training step minimises: next-token cross-entropy plus the recipe's loss terms,
each logged on its own in `metrics.jsonl`.

    objective = Objective(z_loss=1e-4)
    losses = objective(logits, targets, model)  # Losses: the cross-entropy and each term
    torch.autograd.backward(losses.total)

=========  ======================================  ============================================
term       its coefficient                         its value
=========  ======================================  ============================================
z_loss     ``--z-loss COEF`` (0, the default:      ``COEF · mean over positions of (log Z)²``,
           off; PaLM used 1e-4)                    ``log Z = log Σ_j exp(logit_j)``: PaLM's
                                                   (Chowdhery et al. 2022, §5), which keeps the
                                                   softmax's normaliser near 1
aux_loss   the model's, in its spec                the auxiliary losses the forward left on the
           (``moe(aux_loss_coef=...)``)            model's modules, already weighted (a mixture
                                                   of experts' load balancing)
=========  ======================================  ============================================

A term that is off (or a model with no auxiliary loss) is absent, not zero: the step's loss and
its record are then exactly what they were before terms existed. The z-loss shares the
cross-entropy's `logsumexp` (`cross_entropy_and_log_z`), so it costs one square and one mean.
Positions whose target is `IGNORE` (a chat prompt's tokens) count in neither: both means are
over the kept targets (`kept_mean`), and exactly today's when none is ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.model.nn import IGNORE, cross_entropy_and_log_z, kept_mean
from lmcore.model.transformer import TransformerLM

__all__ = ["TERMS", "Losses", "Objective", "logged", "window_means", "z_loss"]

TERMS: Final = ("z_loss", "aux_loss")  # the terms, in the order they are added and logged


def z_loss(log_z: Tensor, coef: float, kept: Tensor | None = None) -> Tensor:
    """PaLM's z-loss: `coef` times the mean over positions of `log_z ** 2` (`log_z`: each
    position's log-partition function, `logsumexp` of its logits); with `kept` (a boolean
    mask: the targets that are not `IGNORE`) the mean over those positions alone, as the
    cross-entropy's."""
    if kept is None:
        return log_z.square().mean() * coef
    return kept_mean(log_z.square(), kept) * coef


@dataclass(frozen=True)
class Losses:
    """One step's cross-entropy and the terms added to it (by name, in `TERMS`' order)."""

    cross_entropy: Tensor
    terms: dict[str, Tensor] = field(default_factory=dict)

    @property
    def total(self) -> Tensor:
        """What the step minimises: the cross-entropy plus every term."""
        total = self.cross_entropy
        for value in self.terms.values():
            total = total + value
        return total

    def detached(self) -> dict[str, Tensor]:
        """The terms, out of the graph, for the log."""
        return {name: value.detach() for name, value in self.terms.items()}


@dataclass(frozen=True)
class Objective:
    """The recipe's loss: cross-entropy plus the z-loss at coefficient `z_loss` (0: off) plus the
    model's auxiliary losses."""

    z_loss: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.z_loss, int | float) and math.isfinite(self.z_loss)
                and self.z_loss >= 0):  # fmt: skip
            raise ValueError(
                f"z_loss={self.z_loss!r}: the z-loss coefficient must be a number ≥ 0 (0: off), "
                "e.g. 1e-4"
            )

    def __call__(self, logits: Tensor, targets: Tensor, model: TransformerLM | None) -> Losses:
        """The losses of `logits` against `targets`; `model`'s auxiliary losses from the forward
        that gave `logits` (None: no model terms)."""
        ce, log_z = cross_entropy_and_log_z(logits, targets)
        terms: dict[str, Tensor] = {}
        if self.z_loss > 0:
            terms["z_loss"] = z_loss(log_z, self.z_loss, targets != IGNORE)
        aux = None if model is None else model.aux_loss()  # None: no module left one
        if aux is not None:
            terms["aux_loss"] = aux
        return Losses(ce, terms)

    def record(self) -> dict[str, Any]:
        """What the recipe record keeps: each term's coefficient (`spec`: the model's spec
        gives it)."""
        return {"cross_entropy": 1.0, "z_loss": self.z_loss, "aux_loss": "spec"}


def window_means(
    rows: Sequence[Mapping[str, Tensor]], mean: Callable[[Tensor], Tensor]
) -> dict[str, float]:
    """Each term's mean over the steps of a log window that had it (`rows`: their detached
    terms), averaged across processes by `mean`; one device sync per term."""
    out: dict[str, float] = {}
    for name in TERMS:
        values = [row[name] for row in rows if name in row]
        if values:
            out[name] = mean(torch.stack(values).mean()).item()
    return out


def logged(loss: float, terms: Mapping[str, float]) -> dict[str, float]:
    """A train record's loss fields beside its `loss` (the cross-entropy): each term, and
    `loss_total`, their sum with it; nothing when no term was on."""
    if not terms:
        return {}
    return {**terms, "loss_total": loss + sum(terms[name] for name in TERMS if name in terms)}
