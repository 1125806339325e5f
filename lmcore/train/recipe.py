"""The training recipe's registry kinds: an optimizer and a schedule, named as a spec names a
component (`muon(momentum=0.95, fallback=adamw)`, `wsd(decay=0.2)`), resolved once through
the registry, built from the model's parameter roles.

What the runner offers each kind's factory (it takes the names its signature has):

=========  =====================================================================
optimizer  ``groups`` (below), ``lr`` (peak), ``weight_decay``, ``betas``, ``eps``;
           returns a `torch.optim.Optimizer`
schedule   ``lr`` (peak), ``min_lr``, ``warmup``, ``decay_steps``, ``steps``; returns a
           function of the step t (1 … steps: the t-th update's) giving the learning rate,
           with no state
=========  =====================================================================

`groups` are parameter groups by role (`lmcore.model.roles`): every parameter of one group has
the same role, matrix axes and splits, learning-rate multiplier and weight decay, and the group
says so: ``{"params", "lr", "lr_scale", "weight_decay", "role", "fan_in", "fan_out",
"splits"}``. An optimizer keeps these keys; before each step the runner sets each group's
``lr`` to ``schedule(t) · lr_scale``.

    part = resolve_recipe("optimizer", "adamw")
    groups, names = param_groups(model, roles_of(model), decay=("matrix",), weight_decay=0.1,
                                 lr=1e-3, multipliers={})
    opt = build_optimizer(part, groups, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmcore.blueprint.lookup import PartLookup
from lmcore.blueprint.origins import Origin, Origins
from lmcore.components import RECIPE_KINDS, Arg, accepted_kwargs, format_scalar
from lmcore.errors import PluginError, SpecError, TrainError, one_of
from lmcore.model.roles import Role
from lmcore.parts import Part
from lmcore.registry import Registry, get_registry
from lmcore.syntax import Item, parse_value
from lmcore.train.losses import Objective

__all__ = [
    "Recipe",
    "build_optimizer",
    "build_schedule",
    "param_groups",
    "provenance",
    "resolve_recipe",
    "role_table",
]


def resolve_recipe(kind: str, text: str, registry: Registry | None = None) -> Part:
    """`text` (`name` or `name(arg=value, ...)`) resolved as a registered `kind` (optimizer or
    schedule): its arguments checked against the declaration, nested components resolved,
    defaults filled in; `str(part.spec)` is its canonical form. A `SpecError` with a caret
    under the offending token names what is wrong and the choices."""
    if kind not in RECIPE_KINDS:
        raise ValueError(f"{kind!r} is not a recipe kind; those are {one_of(RECIPE_KINDS)}")
    registry = registry or get_registry()
    text = text.strip()  # a flag's value as typed, surrounding spaces and all
    value = parse_value(text)
    origins = Origins(text, registry)
    origin = Origin(text, Item(kind, 0, 0, value))
    part = PartLookup(registry, origins).part(kind, value, origin, kind)
    for sub in part.walk():
        try:
            sub.component.check_shape(**sub.kwargs())
        except ValueError as e:
            raise SpecError(f"{sub.kind} {sub.name!r}: {e}", text, value.start, value.end) from None
    return part


def build_optimizer(
    part: Part,
    groups: list[dict[str, Any]],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> torch.optim.Optimizer:
    """The optimizer `part` names over `groups`; a factory that fails or returns anything
    but a `torch.optim.Optimizer` is a `PluginError` naming it."""
    offer = {"groups": groups, "lr": lr, "weight_decay": weight_decay, "betas": betas, "eps": eps}
    optimizer = part.entry.invoke("build", {**offer, **part.kwargs()})
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise PluginError(
            f"optimizer {part.name!r} from {part.provenance}: its factory returned "
            f"{type(optimizer).__name__}; it must return a torch.optim.Optimizer"
        )
    return optimizer


def build_schedule(
    part: Part, *, lr: float, min_lr: float, warmup: int, decay_steps: int, steps: int
) -> Callable[[int], float]:
    """The schedule `part` names, as a function of the step; a factory that fails or returns
    no function is a `PluginError` naming it."""
    offer = {"lr": lr, "min_lr": min_lr, "warmup": warmup, "decay_steps": decay_steps,
             "steps": steps}  # fmt: skip
    schedule = part.entry.invoke("build", {**offer, **part.kwargs()})
    if not callable(schedule):
        raise PluginError(
            f"schedule {part.name!r} from {part.provenance}: its factory returned "
            f"{type(schedule).__name__}; it must return a function of the step"
        )
    return schedule


def takes(part: Part, name: str) -> bool:
    """Whether `part`'s factory (or a nested optimizer's: Muon's fallback) takes `name`."""
    return any(name in accepted_kwargs(p.component.build, {name: None}) for p in part.walk())


def param_groups(
    model: nn.Module,
    roles: Mapping[str, Role],
    *,
    decay: Sequence[str],
    weight_decay: float,
    lr: float,
    multipliers: Mapping[str, float],
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Parameter groups by role (a group per distinct role, axes and splits, in the order the
    parameters come), and each group's parameter names. Roles in `decay` get `weight_decay`,
    the others none; a role in `multipliers` gets that multiple of the learning rate."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    names: dict[tuple[Any, ...], list[str]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        role = roles[name]
        key = (role.name, role.fan_in, role.fan_out, role.splits)
        if key not in groups:
            scale = float(multipliers.get(role.name, 1.0))
            groups[key] = {
                "params": [],
                "lr": lr * scale,
                "lr_scale": scale,
                "weight_decay": weight_decay if role.name in decay else 0.0,
                "role": role.name,
                "fan_in": role.fan_in,
                "fan_out": role.fan_out,
                "splits": list(role.splits),
            }
            names[key] = []
        groups[key]["params"].append(p)
        names[key].append(name)
    return list(groups.values()), list(names.values())


def role_table(groups: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """How each role was optimised, for a run's config: its parameters, learning-rate
    multiplier and weight decay (and, where an optimizer routes roles, the group's `update`:
    what it did with them, when it says)."""
    table: dict[str, dict[str, Any]] = {}
    for g in groups:
        row = table.setdefault(
            g["role"],
            {"tensors": 0, "parameters": 0, "lr_scale": g["lr_scale"],
             "weight_decay": g["weight_decay"]},
        )  # fmt: skip
        row["tensors"] += len(g["params"])
        row["parameters"] += sum(p.numel() for p in g["params"])
        if "update" in g:
            row["update"] = g["update"]
    return table


def provenance(part: Part) -> dict[str, Any]:
    """What a run's config and checkpoint record of a recipe part: its canonical spec and the
    plugin that provided it (and each nested one's)."""
    where = part.provenance
    row: dict[str, Any] = {"spec": str(part.spec), "name": part.name, "dist": where.dist,
                           "version": where.version, "plugin": where.plugin,
                           "module": where.module}  # fmt: skip
    nested = [p for p in part.walk() if p is not part]
    if nested:
        row["uses"] = [provenance(p) | {"kind": p.kind} for p in nested]
    return row


def check_offer(part: Part, name: str, value: Any, default: Any) -> None:
    """`TrainError` when an option set away from its default (`--betas`) means nothing to the
    optimizer `part` names (SGD takes no betas): no option is ignored silently."""
    if value != default and not takes(part, name):
        shown = " ".join(map(format_scalar, value)) if isinstance(value, tuple) else value
        raise TrainError(
            f"--{name} {shown}: optimizer {part.name!r} takes no {name}; its own "
            f"arguments are {one_of([a.name for a in _args(part)]) or 'none'}"
        )


def _args(part: Part) -> tuple[Arg, ...]:
    return part.component.args


@dataclass(frozen=True)
class Recipe:
    """A run's optimizer, schedule and loss terms, resolved once (by `lmcore train`, before
    any run directory exists) and passed on."""

    optimizer: Part
    schedule: Part
    loss: Objective = field(default_factory=Objective)  # no terms but the model's

    @classmethod
    def of(
        cls, optimizer: str, schedule: str, registry: Registry | None = None, *,
        z_loss: float = 0.0,
    ) -> Recipe:  # fmt: skip
        """Both resolved, and the loss with the z-loss at `z_loss` (`lmcore.train.losses`); a
        `TrainError` names the option (`--optimizer: ...`) and keeps the spec error's caret."""
        parts = []
        for kind, text in (("optimizer", optimizer), ("schedule", schedule)):
            try:
                parts.append(resolve_recipe(kind, text, registry))
            except SpecError as e:
                raise TrainError(f"--{kind} {text}: {e}") from None
        try:
            loss = Objective(z_loss=z_loss)
        except ValueError:
            raise TrainError(
                f"--z-loss {z_loss!r}: must be a number ≥ 0 (0: off), e.g. 1e-4"
            ) from None
        return cls(parts[0], parts[1], loss)

    def check_parallel(self, mode: str | None) -> None:
        """`TrainError` for an optimizer that needs whole tensors (it declares `nofsdp`:
        Muon's matrices) under FSDP, which shards them: before the run directory exists."""
        if mode != "fsdp":
            return
        for part in self.optimizer.walk():
            if "nofsdp" in part.component.features:
                raise TrainError(
                    f"--parallel fsdp: optimizer {part.name!r} needs whole matrices and FSDP "
                    f"shards them; use --parallel ddp, or another --optimizer"
                )

    def record(self) -> dict[str, Any]:
        """What run.json and each checkpoint keep of it: the parts' `provenance`, and each loss
        term's coefficient (`Objective.record`)."""
        return {"optimizer": provenance(self.optimizer), "schedule": provenance(self.schedule),
                "loss": self.loss.record()}  # fmt: skip
