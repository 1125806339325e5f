"""Building a model whose weights are about to be loaded, without initialising them.

    with parameters_on_meta():
        model = TransformerLM(bp, device="cpu")   # parameters on meta, buffers on the CPU
    assign(model, tensors)                        # the checkpoint's tensors become the parameters

Initialising a 135M-parameter model (a truncated normal per weight) costs many times reading its
checkpoint, and every value is overwritten by the load. Building the whole model on the meta
device would skip it but lose the buffers a component computes while it is built (RoPE's cos and
sin tables, ...), which are not in a checkpoint. So only the parameters go to meta: while a
thread is inside `parameters_on_meta`, each parameter a module registers there is replaced by a
meta tensor of its shape and dtype (so `torch.nn.init` on it, in lmcore's components or a third
party's, does nothing), while buffers are built for real where the model is asked for. `assign`
then loads the tensors with `load_state_dict(assign=True)`, so a memory-mapped checkpoint's
tensors become the parameters without a copy, and ties the parameters that were one before the
load again.

A component that derives a buffer from a parameter while it is built would get a meta buffer:
`has_meta` finds any, and the caller builds that model the ordinary way instead.

Nothing of `nn.Module` is replaced: torch's parameter registration hook (global, installed while
some thread is inside `parameters_on_meta`) moves a parameter to meta only in a thread that is
inside, so a model built meanwhile in another thread gets real parameters.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.utils.hooks import RemovableHandle

__all__ = ["assign", "has_meta", "parameters_on_meta", "shared_parameters"]

_INSIDE = threading.local()  # .depth: how many parameters_on_meta blocks this thread is in


def _to_meta(module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter | None:
    """The parameter registration hook: in a thread inside `parameters_on_meta`, the parameter
    on meta (same shape, dtype and requires_grad); elsewhere None, which keeps it."""
    if not getattr(_INSIDE, "depth", 0) or param.is_meta:
        return None
    return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)


class _Hook:
    """`_to_meta`, registered with torch while at least one thread is inside
    `parameters_on_meta`, and removed when the last one leaves (later builds pay nothing)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handle: RemovableHandle | None = None
        self.users = 0

    def enter(self) -> None:
        with self.lock:
            if self.handle is None:
                # torch types the hook as returning None, yet documents and uses a returned
                # parameter as the replacement.
                self.handle = register_module_parameter_registration_hook(_to_meta)  # type: ignore[arg-type]
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.handle is not None:
                self.handle.remove()
                self.handle = None


_HOOK = _Hook()


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside, every parameter this thread registers on any module is put on the meta device
    (same shape, dtype and requires_grad); buffers are left as built, and modules other threads
    build meanwhile are untouched. Blocks nest, and threads may be inside at the same time."""
    _HOOK.enter()
    _INSIDE.depth = getattr(_INSIDE, "depth", 0) + 1
    try:
        yield
    finally:
        _INSIDE.depth -= 1
        _HOOK.leave()


def has_meta(model: nn.Module) -> list[str]:
    """The names of the model's buffers (and parameters) that live on the meta device."""
    named = [*model.named_buffers(), *model.named_parameters()]
    return [name for name, t in named if t.is_meta]


def shared_parameters(model: nn.Module) -> dict[str, str]:
    """{alias: first name} for every parameter the model holds under more than one name (tied
    embeddings), found by identity, which works on meta tensors too."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def assign(model: nn.Module, tensors: Mapping[str, Tensor], device: torch.device) -> None:
    """`load_state_dict(tensors, strict=True, assign=True)` after moving each tensor to `device`
    and its parameter's dtype (no copy when it is there already), then each alias of a shared
    parameter made the very same parameter again."""
    aliases = shared_parameters(model)
    expected = model.state_dict(keep_vars=True)
    moved: dict[int, Tensor] = {}
    state = {}
    for name, t in tensors.items():
        want = expected[name]
        if id(t) not in moved:
            moved[id(t)] = t.to(device=device, dtype=want.dtype)
        state[name] = moved[id(t)]
    model.load_state_dict(state, strict=True, assign=True)
    for alias, name in aliases.items():
        owner, _, attr = alias.rpartition(".")
        setattr(model.get_submodule(owner), attr, model.get_parameter(name))
