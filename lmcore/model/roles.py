"""What each parameter is for, declared by the module that creates it: the role that drives
weight decay, an optimizer's routing (Muon orthogonalises hidden matrices, never an
embedding or the head) and per-role learning rates, correct by construction rather than by
matching names.

A module declares the roles of the parameters it creates itself (not those of its children)
with a method ``parameter_roles() -> Mapping[str, Role]`` keyed by the local name
(``"weight"``); an ancestor may declare a descendant's by its dotted path
(``{"lm_head.weight": HEAD}``), which wins over the descendant's own. `roles_of` walks a
model and checks every parameter has exactly one role fitting its shape.

    class Gate(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(d))
        def parameter_roles(self):
            return {"scale": GAIN}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from torch import nn

from lmcore.components import ROLES
from lmcore.errors import PluginError, did_you_mean, one_of

__all__ = [
    "BIAS",
    "CONV",
    "EMBEDDING",
    "GAIN",
    "HEAD",
    "MATRIX",
    "MATRIX_ROLES",
    "ROLES",
    "ROUTER",
    "SCALAR",
    "Role",
    "check_role_name",
    "matrix",
    "packed",
    "roles_of",
]

# Every role, in the order `describe` lists them. matrix: a hidden projection (its fan-in and
# fan-out axes; any others are a batch of matrices, e.g. stacked experts); packed: several
# logical matrices concatenated along the fan-out axis (fused q/k/v, Mamba's in_proj);
# embedding: a lookup table; head: the output projection to the vocabulary; gain: a norm's
# multiplicative weight; bias: an additive one; router: a mixture's gate over experts;
# scalar: per-head or per-channel numbers that are neither (A_log, dt_bias, sinks, a
# learned residual scale); conv: a depthwise convolution's filter.
# The roles whose tensors are matrices an optimizer may treat as such (fan-in, fan-out).
MATRIX_ROLES: Final = ("matrix", "packed", "head", "router", "embedding")


@dataclass(frozen=True)
class Role:
    """One parameter's role. `fan_in` / `fan_out`: the axes of the matrix (matrix, packed,
    head, router, embedding); `splits`: a packed tensor's logical matrices, their sizes along
    `fan_out` in order."""

    name: str
    fan_in: int | None = None
    fan_out: int | None = None
    splits: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_role_name(self.name)

    def problem(self, shape: tuple[int, ...]) -> str | None:
        """Why this role does not fit a tensor of `shape`, or None."""
        if self.name in MATRIX_ROLES:
            if len(shape) < 2:
                return f"a {self.name} needs a tensor of at least 2 dimensions, got shape {shape}"
            for axis in (self.fan_in, self.fan_out):
                if axis is None or not -len(shape) <= axis < len(shape):
                    return (
                        f"its axes (fan_in {self.fan_in}, fan_out {self.fan_out}) do not fit "
                        f"shape {shape}"
                    )
            if self.fan_in % len(shape) == self.fan_out % len(shape):  # type: ignore[operator]
                return f"fan_in and fan_out are the same axis ({self.fan_in})"
        if self.name == "packed":
            rows = shape[self.fan_out]  # type: ignore[index]
            if not self.splits or any(s < 1 for s in self.splits) or sum(self.splits) != rows:
                return (
                    f"its splits {list(self.splits)} must be positive and add up to the "
                    f"{rows} rows of axis {self.fan_out} (shape {shape})"
                )
        elif self.splits:
            return f"only a packed tensor has splits, got {list(self.splits)}"
        if self.name in ("gain", "bias") and len(shape) < 1:
            return f"a {self.name} is a vector, got a 0-dimensional tensor"
        return None

    def __str__(self) -> str:
        if self.name == "packed":
            return f"packed({'+'.join(map(str, self.splits))})"
        return self.name


def check_role_name(name: str) -> None:
    if name not in ROLES:
        raise ValueError(
            f"unknown parameter role {name!r}; roles are {one_of(ROLES)}" + did_you_mean(name, ROLES)
        )


def matrix(fan_in: int = -1, fan_out: int = -2) -> Role:
    """A hidden matrix; by default stored (out, in) as `Linear`'s weight."""
    return Role("matrix", fan_in, fan_out)


def packed(*splits: int, fan_in: int = -1, fan_out: int = -2) -> Role:
    """Several logical matrices in one tensor: `splits` rows each along `fan_out`, in order."""
    return Role("packed", fan_in, fan_out, tuple(splits))


MATRIX: Final = matrix()
EMBEDDING: Final = Role("embedding", fan_in=0, fan_out=1)  # (vocab, d): a row per token
HEAD: Final = Role("head", fan_in=-1, fan_out=-2)
ROUTER: Final = Role("router", fan_in=-1, fan_out=-2)
GAIN: Final = Role("gain")
BIAS: Final = Role("bias")
SCALAR: Final = Role("scalar")
CONV: Final = Role("conv")


def roles_of(model: nn.Module) -> dict[str, Role]:
    """The role of every parameter of `model` by its name in `named_parameters()` (a shared
    parameter once, under its first name). A `PluginError` names a parameter without a role
    (and the module class that should declare it), a declaration naming no parameter, or a
    role that does not fit its tensor's shape."""
    params = dict(model.named_parameters())
    ids = {id(p): name for name, p in params.items()}  # a tied parameter: its first name
    declared: dict[str, tuple[Role, str]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        declare = getattr(module, "parameter_roles", None)
        if declare is None:
            continue
        where = type(module).__name__
        table = declare()
        for local, role in table.items():
            path = f"{prefix}.{local}" if prefix else local
            target = module.get_parameter(local) if _has(module, local) else None
            if target is None:
                if _declared_none(module, local):
                    continue  # an optional parameter left out (bias=False)
                raise PluginError(
                    f"{where}.parameter_roles() declares {local!r}, which is not one of its "
                    f"parameters ({one_of([n for n, _ in module.named_parameters()])})"
                )
            if not isinstance(role, Role):
                raise PluginError(
                    f"{where}.parameter_roles() gives {local!r} {role!r}; roles are "
                    "lmcore.model.roles.Role objects (MATRIX, GAIN, packed(...), ...)"
                )
            name = ids.get(id(target), path)
            if name in declared and len(declared[name][1]) <= len(prefix):
                continue  # an ancestor (a shorter prefix) declared it already: it wins
            declared[name] = (role, prefix)
    roles: dict[str, Role] = {}
    for name, p in params.items():
        if name not in declared:
            owner, _, local = name.rpartition(".")
            cls = type(model.get_submodule(owner) if owner else model).__name__
            raise PluginError(
                f"parameter {name!r} has no role: {cls} should declare it in "
                f"parameter_roles() ({{{local!r}: ...}}; roles are {one_of(ROLES)})"
            )
        role = declared[name][0]
        problem = role.problem(tuple(p.shape))
        if problem is not None:
            raise PluginError(f"parameter {name!r} is declared {role}: {problem}")
        roles[name] = role
    return roles


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_parameter(path)
    except AttributeError:
        return False
    return True


def _declared_none(module: nn.Module, path: str) -> bool:
    """Whether `path` names an attribute set to None (an optional parameter not created) or
    a buffer in a parameter's place (a matrix a weight format stores: `lmcore.model.quant`)."""
    owner, _, local = path.rpartition(".")
    try:
        holder = module.get_submodule(owner) if owner else module
    except AttributeError:
        return False
    value = getattr(holder, local, ...)
    return value is None or (value is not ... and local in holder._buffers)
