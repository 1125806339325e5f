"""The optimizer of `lmcore train`: AdamW's parameter groups (weight decay on matrices only),
`torch.optim.AdamW` fused where torch has the kernel, and global-norm gradient clipping.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from lmcore.train.config import TrainConfig

__all__ = ["clip_gradients", "make_optimizer", "param_groups"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's groups: matrices (ndim ≥ 2: projections, embeddings, lm_head) decay; vectors and
    scalars (norm gains, biases) do not. Each group's `names` lists its parameters; empty
    groups are left out. A tied parameter appears once."""
    decay: dict[str, list[Any]] = {"params": [], "names": []}
    keep: dict[str, list[Any]] = {"params": [], "names": []}
    for name, p in model.named_parameters():
        if p.requires_grad:
            group = decay if p.ndim >= 2 else keep
            group["params"].append(p)
            group["names"].append(name)
    groups = [{**decay, "weight_decay": weight_decay}, {**keep, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(
    model: nn.Module, config: TrainConfig, device: torch.device
) -> tuple[torch.optim.AdamW, list[list[str]], str]:
    """`torch.optim.AdamW` over `param_groups`: fused where torch has the kernel for `device`
    and the parameters' dtype, else foreach. Returns it, each group's parameter names, and
    which implementation it is."""
    groups = param_groups(model, config.weight_decay)
    names = [g.pop("names") for g in groups]
    common: dict[str, Any] = {"lr": config.lr, "betas": config.betas, "eps": config.eps}
    try:
        return torch.optim.AdamW(groups, fused=True, **common), names, "fused"
    except (RuntimeError, ValueError):  # no fused kernel for this device or dtype
        return torch.optim.AdamW(groups, foreach=True, **common), names, "foreach"


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
