"""Adapters: a small trainable update of some of a built model's matrices, the rest frozen.

A spec names one with its `adapter` key (``tinystories, adapter=lora(rank=8)``; `none`, the
default, is a plain model whose canonical string is unchanged). After the model is assembled,
`apply_adapter` picks the targets, builds one adapter module per targeted `Linear` (the
factory gets `in_features`, `out_features` and `splits`) and keeps it as that Linear's child
``adapter``, whose output a forward hook adds to the Linear's: ``W x + ΔW x``. The base's
parameters keep their names and tensors (its state dict is the plain model's, plus the
``….adapter.*`` keys) and are frozen (``requires_grad=False``), so an optimizer built from
`param_groups` sees only the adapter's.

Targets: the adapter's `targets` argument (default ``matrix,packed``), a comma-separated list
of parameter roles (`lmcore.model.roles`: the Linear whose weight has that role) and module
names (a Linear whose last name is the word, ``q_proj``, or whose dotted path matches it as a
glob, ``layers.0.*``). A packed matrix (fused q/k/v, Mamba's in_proj) gets `splits`, one entry
per logical matrix, so an adapter may update each on its own (`lora` does). Only a linear
layer can be targeted: lmcore's `Linear` or torch's `nn.Linear`, which plugins on torch's
kernels use (`examples/lmcore-torch`); both compute ``x @ W.T`` (nn.Linear plus its bias),
which the hook extends. A targeted parameter of another module (stacked experts) or a tied
one is refused by name.

`lmcore.adapting` saves an adapter on its own (with its base checkpoint's identity), loads it
back onto its base, and merges it (``W + delta()``) into a plain model.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any, Final

from torch import Tensor, nn

from lmcore.components import ROLES
from lmcore.errors import PluginError, SpecError, did_you_mean, one_of
from lmcore.model.nn import Linear
from lmcore.model.roles import roles_of
from lmcore.parts import Part

__all__ = [
    "ATTR",
    "LINEARS",
    "DEFAULT_TARGETS",
    "adapted",
    "adapter_state",
    "adapters",
    "apply_adapter",
    "freeze_base",
    "parameter_counts",
    "select_targets",
    "with_adapter",
]

ATTR: Final = "adapter"  # the child of each targeted Linear holding its adapter
# the modules whose output is x @ W.T (+ bias), the only ones the hook's update is right for
LINEARS: Final = (Linear, nn.Linear)
DEFAULT_TARGETS: Final = "matrix,packed"


def _add_update(module: nn.Module, args: tuple[Any, ...], out: Tensor) -> Tensor:
    """The forward hook of a targeted Linear: its output plus its adapter's."""
    update: Tensor = getattr(module, ATTR)(args[0])
    return out + update.to(out.dtype)


def target_words(part: Part) -> list[str]:
    """The adapter's `targets` (its argument, else `DEFAULT_TARGETS`) as a list of words."""
    text = part.kwargs().get("targets", DEFAULT_TARGETS)
    words = [w.strip() for w in str(text).split(",") if w.strip()]
    if not words:
        raise SpecError(
            f"adapter {part.name!r}: targets={text!r} names nothing; give roles and/or module "
            f'names, e.g. targets=matrix or targets="q_proj,v_proj"'
        )
    return words


def select_targets(model: nn.Module, words: list[str]) -> list[str]:
    """The dotted names of the Linear modules `words` (roles and module names) target, in model
    order. A word that targets nothing, a targeted parameter outside a Linear and a tied one
    are `SpecError`s naming it and the choices."""
    roles = roles_of(model)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, LINEARS)}
    linears = {n: m for n, m in linears.items() if f".{ATTR}." not in f".{n}."}
    named = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        named.setdefault(id(p), []).append(name)
    leaves = sorted({n.rpartition(".")[2] for n in linears})
    hit: set[str] = set()
    for word in words:
        found: set[str] = set()
        if word in ROLES:
            for pname, role in roles.items():
                if role.name != word:
                    continue
                owner, _, local = pname.rpartition(".")
                if owner not in linears or local != "weight":
                    raise SpecError(
                        f"adapter targets={word}: parameter {pname!r} has role {word} but is "
                        f"not a Linear's weight, which is all an adapter can update; name the "
                        f'modules instead, e.g. targets="q_proj,v_proj"'
                    )
                found.add(owner)
        else:
            found = {n for n in linears if n.rpartition(".")[2] == word
                     or fnmatch.fnmatchcase(n, word)}  # fmt: skip
        if not found and word not in ROLES:  # a role this model has no matrix of is fine
            raise SpecError(
                f"adapter targets: {word!r} names no role and no Linear of this model; give "
                f"roles ({one_of(ROLES)}) or module names ({one_of(leaves)})"
                + did_you_mean(word, [*ROLES, *leaves])
            )
        hit |= found
    if not hit:
        raise SpecError(
            f"adapter targets={','.join(words)}: no Linear of this model has those roles; "
            f"name modules instead ({one_of(leaves)})"
        )
    for name in hit:
        if len(named[id(linears[name].weight)]) > 1:
            raise SpecError(
                f"adapter targets: {name}.weight is tied ({', '.join(named[id(linears[name].weight)])}"
                "); an update to it would change both: leave it out of the targets"
            )
    return [n for n in linears if n in hit]


def apply_adapter(
    model: nn.Module, part: Part, *, device: Any = None, dtype: Any = None
) -> list[str]:
    """Give `model` the adapter `part` names (resolved: `model.blueprint.parts["adapter"]`, or
    `lmcore.blueprint.resolve(...)` of a spec with one) in place and freeze its base; returns
    the targeted modules' names. A model loaded from a checkpoint takes one this way (then set
    `model.blueprint` to the blueprint with the adapter, as `with_adapter` does)."""
    if adapted(model):
        raise PluginError("this model has an adapter already; merge it first (lmcore.model."
                          "adapters.merged) or start from the base")  # fmt: skip
    names = select_targets(model, target_words(part))
    roles = roles_of(model)
    for name in names:
        linear = model.get_submodule(name)
        role = roles[f"{name}.weight"]
        splits = role.splits if role.name == "packed" else (linear.out_features,)
        weight = linear.weight
        module = part.create(
            in_features=linear.in_features, out_features=linear.out_features,
            splits=tuple(splits), device=device if device is not None else weight.device,
            dtype=dtype if dtype is not None else weight.dtype,
        )  # fmt: skip
        if not callable(getattr(module, "delta", None)):
            raise PluginError(
                f"adapter {part.name!r} from {part.provenance}: its module has no delta(); an "
                "adapter gives its update as a matrix (lmcore.interfaces.Adapter)"
            )
        linear.add_module(ATTR, module)
        linear.register_forward_hook(_add_update)
    freeze_base(model)
    return names


def freeze_base(model: nn.Module) -> None:
    """Every parameter outside the adapters frozen, the adapters' trainable."""
    inside = {id(p) for _, m in adapters(model) for p in m.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in inside)


def adapters(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """`(name of the targeted Linear, its adapter)` for each one."""
    for name, m in model.named_modules():
        if isinstance(m, LINEARS) and isinstance(getattr(m, ATTR, None), nn.Module):
            yield name, getattr(m, ATTR)


def adapted(model: nn.Module) -> bool:
    """Whether `model` has an adapter applied."""
    return next(adapters(model), None) is not None


def adapter_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters' part of the state dict (keys ``<linear>.adapter.<name>``), no base."""
    out: dict[str, Tensor] = {}
    for name, m in adapters(model):
        for key, t in m.state_dict().items():
            out[f"{name}.{ATTR}.{key}"] = t
    return out


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """`(trainable, frozen)` parameter counts, each shared tensor once."""
    trainable = frozen = 0
    for p in model.parameters():
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return trainable, frozen


def with_adapter(model: Any, text: str) -> list[str]:
    """Give a built (e.g. loaded) plain `model` the adapter `text` names (``lora(rank=8)``):
    its blueprint becomes the spec with ``adapter=text``, resolved in the model's registry,
    and the adapter is applied (`apply_adapter`). For `lmcore train CKPT --adapter ...`."""
    from lmcore.blueprint import resolve

    bp = model.blueprint
    if bp.spec.adapter is not None:
        raise PluginError(f"this model has an adapter already (adapter={bp.spec.adapter})")
    new = resolve(f"{bp.spec},adapter={text}", bp.registry)
    names = apply_adapter(model, new.parts["adapter"])
    model.blueprint, model.spec = new, new.spec
    return names
