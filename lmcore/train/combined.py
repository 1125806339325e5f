"""One optimizer made of several, each over its own parameter groups: Muon for the hidden
matrices and its fallback for the rest, as one `torch.optim.Optimizer` the runner treats like
any other (its lr-per-group loop, `state_dict` / `load_state_dict`, resume bit for bit).

    opt = Combined([("muon", Muon(matrix_groups, ...)), ("adamw", AdamW(other_groups, ...))])
    opt.param_groups      # muon's groups, then adamw's: the same dicts, each with "update"

Its `param_groups` are its parts' groups (the same dict objects, so setting a group's `lr`
reaches the part that steps it), each marked with the name of the part that updates it under
``"update"`` (`lmcore.train.recipe.role_table` reports it). The parts share one `state`
(their parameters are disjoint), so the state dict is torch's usual form, indexed over all the
groups in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["UPDATE", "Combined"]

UPDATE = "update"  # the group key naming the part that updates the group


class Combined(torch.optim.Optimizer):
    """The optimizers `parts` (name, optimizer) as one, stepped in order. Each part must be
    freshly built (no state yet); a parameter in two parts is a `ValueError`."""

    def __init__(self, parts: Sequence[tuple[str, torch.optim.Optimizer]]):
        groups: list[dict[str, Any]] = []
        for name, opt in parts:
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"part {name!r} is a {type(opt).__name__}, not an optimizer")
            if opt.state:
                raise ValueError(f"part {name!r} has taken steps already; combine fresh ones")
            for g in opt.param_groups:
                g.setdefault(UPDATE, name)  # a nested Combined's groups keep their own name
                groups.append(g)
        super().__init__(groups, {})  # keeps the group dicts; refuses a shared parameter
        self.parts: dict[str, torch.optim.Optimizer] = dict(parts)
        self._sizes = [len(opt.param_groups) for _, opt in parts]
        for opt in self.parts.values():
            opt.state = self.state

    @torch.no_grad()  # type: ignore[misc]
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.parts.values():
            opt.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's `load_state_dict` (new group dicts, the state cast to each parameter), then
        each part handed its groups and the shared state again, through its own
        `__setstate__` (where a part fills in options its groups lack, as torch's do)."""
        super().load_state_dict(state_dict)
        start = 0
        for opt, n in zip(self.parts.values(), self._sizes, strict=True):
            opt.__setstate__(
                {"state": self.state, "param_groups": self.param_groups[start : start + n]}
            )
            start += n

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "parts"):  # after construction: which part would step it?
            raise TypeError("add a group to one of the parts before combining them")
        super().add_param_group(param_group)
