"""Parametrizations: how a model's width sets its initialisation, its per-role learning rates and
its output and attention multipliers, from each parameter's declared role (`lmcore.model.roles`).

A spec names one with its `parametrization` key (``tinystories, parametrization=mup(base_width=
128)``; `none`, the default, is the standard parametrization: today's model, byte for byte, with
an unchanged canonical string). The component's factory gets ``d_model``, ``vocab_size`` and
``tie_embeddings`` and returns the rules (a `Parametrization`), not a module:

- ``init_std(role, shape)``: the standard deviation each parameter of that role and shape is
  drawn with (a truncated normal on ±3σ, as every lmcore matrix is; a packed tensor per logical
  matrix); None keeps what the component's own factory drew (norm gains, biases, scalars);
- ``lr_scale(role)``: the multiple of the run's learning rate that role's group gets (the
  rules hold for an optimizer whose update is normalised entry by entry: those declaring the
  ``entrywise`` feature, AdamW and Lion; another one is refused by name);
- ``output_multiplier``: the logits are multiplied by it;
- ``query_factor``: the attention's query scale (``query_scale``, default 1/sqrt(head_dim)) is
  multiplied by it (muP's 1/d attention).

`apply_parametrization` re-draws the model's parameters after it is assembled; `lr_multipliers`
gives the per-role learning-rate multipliers `lmcore.train.optim` builds the groups with. A
model with a parameter whose component declares no role is refused, naming the component.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from lmcore.errors import PluginError, TrainError
from lmcore.model.roles import Role, roles_of
from lmcore.parts import Part
from lmcore.spec import ComponentSpec

if TYPE_CHECKING:
    from lmcore.blueprint import Blueprint

__all__ = [
    "Parametrization",
    "apply_parametrization",
    "check_optimizer",
    "lr_multipliers",
    "parametrize",
    "query_factor",
    "rules",
    "rules_of",
]


@runtime_checkable
class Parametrization(Protocol):
    """The rules a parametrization's factory returns for one model (its widths fixed)."""

    output_multiplier: float
    query_factor: float

    def init_std(self, role: Role, shape: tuple[int, ...]) -> float | None: ...

    def lr_scale(self, role: Role) -> float: ...


def rules(part: Part, dims: dict[str, Any]) -> Parametrization:
    """The rules `part` (a resolved parametrization) gives for the model dimensions `dims`; a
    factory that fails or returns anything else is a `PluginError` naming it."""
    found = part.entry.invoke("build", {**dims, **part.kwargs()})
    if not isinstance(found, Parametrization):
        raise PluginError(
            f"parametrization {part.name!r} from {part.provenance}: its factory returned "
            f"{type(found).__name__}, not lmcore.model.parametrization.Parametrization rules "
            "(output_multiplier, query_factor, init_std(role, shape), lr_scale(role))"
        )
    return found


def query_factor(bp: Blueprint) -> float:
    """What the (layer) blueprint's parametrization multiplies the query scale by; 1.0 for the
    standard one, so its scale stays exactly the spec's."""
    if "parametrization" not in bp.parts:
        return 1.0
    return float(rules(bp.parts["parametrization"], bp.spec.dims("parametrization")).query_factor)


def parametrize(model: Any) -> float:
    """Apply the assembled `model`'s parametrization, if its spec names one: its rules kept as
    `model.parametrization` (None: standard) and its draws made. Returns the output multiplier
    (1.0 for the standard parametrization)."""
    bp = model.blueprint
    model.parametrization = None
    if "parametrization" not in bp.parts:
        return 1.0
    part = bp.parts["parametrization"]
    for _, lbp in bp.groups():
        block = lbp.parts["block"]
        if "nomup" in block.component.features:
            raise PluginError(
                f"parametrization={part.spec}: block {block.name!r} from {block.provenance} "
                "declares 'nomup' (its residual stream is not of unit scale per coordinate, "
                "which muP's rules assume); leave out parametrization= or use another block"
            )
    found = rules(part, bp.spec.dims("parametrization"))
    apply_parametrization(model, part, found)
    model.parametrization = found
    return float(found.output_multiplier)


def rules_of(model: nn.Module) -> Parametrization | None:
    """The rules of the model's parametrization (built once, at assembly), or None (standard)."""
    found: Parametrization | None = getattr(model, "parametrization", None)
    return found


@torch.no_grad()
def apply_parametrization(model: nn.Module, part: Part, found: Parametrization) -> None:
    """Re-draw every parameter of an assembled model whose role the rules give a std for.
    A parameter without a declared role is refused, naming the component it belongs to."""
    try:
        roles = roles_of(model)
    except PluginError as e:
        raise PluginError(f"parametrization={part.spec}: {_component_of(model, e)}{e}") from None
    for name, p in model.named_parameters():
        role = roles[name]
        if role.name == "packed":  # each logical matrix drawn for its own shape
            axis = role.fan_out % p.dim()  # type: ignore[operator]
            for chunk in torch.split(p.data, list(role.splits), dim=axis):
                _draw(chunk, found.init_std(role, tuple(chunk.shape)), name, part)
            continue
        _draw(p.data, found.init_std(role, tuple(p.shape)), name, part)


def _draw(t: torch.Tensor, std: float | None, name: str, part: Part) -> None:
    if std is None:
        return
    if not (math.isfinite(std) and std >= 0):
        raise PluginError(
            f"parametrization {part.name!r} from {part.provenance}: init_std of {name} is "
            f"{std!r}; it must be a finite number >= 0 (or None: keep the component's own)"
        )
    if std == 0:
        t.zero_()
    else:
        nn.init.trunc_normal_(t, mean=0.0, std=std, a=-3 * std, b=3 * std)


def _component_of(model: nn.Module, error: PluginError) -> str:
    """``"ffn 'name' from dist: "``: the component whose module defines the class a role error
    names, when one of the model's parts does (its factory's module defines the class)."""
    bp = getattr(model, "blueprint", None)
    if bp is None:
        return ""
    text = str(error)
    for _, part in bp.used():
        module = getattr(part.component.build, "__module__", None)
        for sub in model.modules():
            cls = type(sub)
            if cls.__module__ == module and f"{cls.__name__} should declare" in text:
                return f"{part.kind} {part.name!r} from {part.provenance} declares no roles: "
    return ""


def lr_multipliers(model: nn.Module) -> dict[str, float]:
    """The learning-rate multiple of each role of `model` under its parametrization (none: {})."""
    found = rules_of(model)
    if found is None:
        return {}
    out: dict[str, float] = {}
    for role in roles_of(model).values():
        scale = float(found.lr_scale(role))
        if role.name in out and out[role.name] != scale:
            raise PluginError(
                f"parametrization gives role {role.name} two learning-rate multiples "
                f"({out[role.name]!r}, {scale!r}); groups are by role"
            )
        out[role.name] = scale
    return out


def check_optimizer(parametrization: ComponentSpec | None, optimizer: Part) -> None:
    """`TrainError` for an optimizer whose update is not normalised entry by entry (it does not
    declare ``entrywise``: SGD, Muon) under a parametrization (`parametrization`, the spec's
    key; None: the standard one, any optimizer), whose learning-rate rules are Adam's."""
    if parametrization is None:
        return
    for part in optimizer.walk():
        if "entrywise" not in part.component.features:
            raise TrainError(
                f"--optimizer {optimizer.spec}: parametrization={parametrization} sets learning "
                f"rates by Adam's rules, and optimizer {part.name!r} does not declare the "
                "'entrywise' feature (an update normalised entry by entry); use --optimizer "
                "adamw or lion"
            )
