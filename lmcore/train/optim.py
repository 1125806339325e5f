"""The optimizer of `lmcore train`: the registered optimizer the run names (`--optimizer`,
default `adamw`) over parameter groups by role (`lmcore.model.roles`: weight decay on the roles
`--decay` names, learning-rate multipliers by `--role-lr`), and global-norm gradient clipping.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from lmcore.errors import PluginError
from lmcore.model.parametrization import check_optimizer, lr_multipliers
from lmcore.model.roles import roles_of
from lmcore.parts import Part
from lmcore.spec import ModelSpec
from lmcore.train.recipe import build_optimizer, check_offer, param_groups, resolve_recipe

if TYPE_CHECKING:
    from lmcore.train.config import TrainConfig

__all__ = ["clip_gradients", "make_optimizer", "role_groups"]


def role_groups(
    model: nn.Module, config: TrainConfig
) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """The run's parameter groups by role, and each group's parameter names: `--role-lr`'s
    multipliers times the model's parametrization's (muP's 1/m on hidden matrices)."""
    from lmcore.train.config import decay_roles, role_multipliers

    multipliers = role_multipliers(config.role_lr)
    for role, scale in lr_multipliers(model).items():
        multipliers[role] = multipliers.get(role, 1.0) * scale
    return param_groups(
        model,
        roles_of(model),
        decay=decay_roles(config.decay),
        weight_decay=config.weight_decay,
        lr=config.lr,
        multipliers=multipliers,
    )


def make_optimizer(
    model: nn.Module, config: TrainConfig, part: Part | None = None
) -> tuple[torch.optim.Optimizer, list[list[str]], Part]:
    """The optimizer `config.optimizer` names (or `part`, resolved already) over the model's
    role groups; returns it, the parameter names of each of its `param_groups` (in its own
    order) and its part. Every trainable parameter must be in exactly one of its groups."""
    from lmcore.train.config import TrainConfig

    part = part or resolve_recipe("optimizer", config.optimizer)
    default = TrainConfig()
    check_offer(part, "betas", config.betas, default.betas)
    check_offer(part, "eps", config.eps, default.eps)
    spec = getattr(model, "spec", None)  # muP's rules are Adam's
    check_optimizer(spec.parametrization if isinstance(spec, ModelSpec) else None, part)
    groups, _ = role_groups(model, config)
    optimizer = build_optimizer(part, groups, lr=config.lr, weight_decay=config.weight_decay,
                                betas=config.betas, eps=config.eps)  # fmt: skip
    return optimizer, group_names(model, optimizer, part), part


def group_names(
    model: nn.Module, optimizer: torch.optim.Optimizer, part: Part
) -> list[list[str]]:
    """The names of each group's parameters; a `PluginError` when the optimizer leaves a
    trainable parameter without an update rule, holds one twice, or holds one not the model's."""
    name_of = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    names: list[list[str]] = []
    seen: set[int] = set()
    for g in optimizer.param_groups:
        row = []
        for p in g["params"]:
            if id(p) not in name_of or id(p) in seen:
                what = "twice" if id(p) in seen else "a tensor that is not a trainable parameter"
                raise PluginError(f"optimizer {part.name!r} from {part.provenance} holds {what}")
            seen.add(id(p))
            row.append(name_of[id(p)])
        names.append(row)
    left = [n for i, n in name_of.items() if i not in seen]
    if left:
        raise PluginError(
            f"optimizer {part.name!r} from {part.provenance} leaves {len(left)} parameter(s) "
            f"without an update rule, e.g. {left[0]!r}"
        )
    return names


def clip_gradients(parameters: Iterable[Tensor], max_norm: float | None) -> Tensor:
    """Scale every gradient by `max_norm / (norm + 1e-6)` when their global L2 norm exceeds
    `max_norm` (`torch.nn.utils.clip_grad_norm_`); return the norm before clipping."""
    params = [p for p in parameters if p.grad is not None]
    if max_norm is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    full = getattr(norm, "full_tensor", None)  # FSDP's sharded gradients: a DTensor
    return full() if full is not None else norm
