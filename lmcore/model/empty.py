"""Building a model whose weights are about to be loaded, without initialising them.

    with parameters_on_meta():
        model = TransformerLM(bp, device="cpu")   # parameters on meta, buffers on the CPU
    assign(model, tensors)                        # the checkpoint's tensors become the parameters

Initialising a 135M-parameter model (a truncated normal per weight) costs many times reading its
checkpoint, and every value is overwritten by the load. Building the whole model on the meta
device would skip it but lose the buffers a component computes while it is built (RoPE's cos and
sin tables, ...), which are not in a checkpoint. So only the parameters go to meta: while
`parameters_on_meta` is active, each parameter a module registers is replaced by a meta tensor of
its shape and dtype (so `torch.nn.init` on it, in lmcore's components or a third party's, does
nothing), while buffers are built for real where the model is asked for. `assign` then loads the
tensors with `load_state_dict(assign=True)`, so a memory-mapped checkpoint's tensors become the
parameters without a copy, and ties the parameters that were one before the load again.

A component that derives a buffer from a parameter while it is built would get a meta buffer:
`has_meta` finds any, and the caller builds that model the ordinary way instead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

__all__ = ["assign", "has_meta", "parameters_on_meta", "shared_parameters"]

_LOCK = threading.Lock()


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside, every parameter registered on any module is put on the meta device (same shape,
    dtype and requires_grad); buffers are left as built. One thread at a time."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    with _LOCK:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
        try:
            yield
        finally:
            nn.Module.register_parameter = original  # type: ignore[method-assign]


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
