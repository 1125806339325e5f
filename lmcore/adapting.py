"""Adapters on checkpoints: give a loaded base one, save it alone, merge it into a plain model.

    model = adapt("base.safetensors", "lora(rank=8)")   # the base loaded, frozen, adapted
    ... train ...
    model.save("adapter.safetensors")                  # the adapter's weights alone + the base's id
    again = lmcore.load("adapter.safetensors")         # the base (checked) with the adapter
    plain = merged(again); plain.save("merged.safetensors")   # W + ΔW: a plain checkpoint

An adapter file records its base checkpoint's path, spec and checksum
(`lmcore.checkpoint.base_identity`); loading it loads that base, refuses one whose checksum
differs (naming both), and applies the adapter. `lmcore convert --merge` is `merged` on the
command line. The adapter itself is `lmcore.model.adapters`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from lmcore.blueprint import resolve
from lmcore.checkpoint import base_identity
from lmcore.errors import PluginError
from lmcore.model.adapters import ATTR, adapters, adapted, with_adapter
from lmcore.model.empty import assign, parameters_on_meta
from lmcore.model.transformer import TransformerLM
from lmcore.sources import load

__all__ = ["adapt", "attach_base", "merged"]


def adapt(
    base: str | os.PathLike[str], adapter: str, device: Any = None, dtype: Any = None
) -> TransformerLM:
    """The checkpoint `base` loaded with the adapter `adapter` names (``lora(rank=8)``) applied
    and its base frozen; it remembers the base, so `save` writes the adapter alone."""
    model = load(base, device, dtype)
    with_adapter(model, adapter)
    attach_base(model, base)
    return model


def attach_base(model: TransformerLM, base: str | os.PathLike[str]) -> None:
    """Record that `model`'s base is the checkpoint `base` (its path, spec and checksum), so
    that `model.save` writes the adapter's weights alone. For a caller that applied the adapter
    itself (`lmcore.model.adapters.with_adapter`)."""
    model.adapter_base = base_identity(base)


@torch.no_grad()
def merged(model: TransformerLM) -> TransformerLM:
    """A plain model (the spec without its adapter) whose every targeted matrix is
    ``W + delta()``, added in float32 and stored in W's dtype; `model` is left as it was, and
    the tokenizer is kept."""
    bp = model.blueprint
    if bp.spec.adapter is None or not adapted(model):
        raise PluginError("this model has no adapter to merge (its spec has adapter=none)")
    plain_bp = resolve(replace(bp.spec, adapter=None), bp.registry)
    state = {k: v for k, v in model.state_dict().items() if f".{ATTR}." not in k}
    for name, m in adapters(model):
        key = f"{name}.weight"
        w = state[key]
        delta = m.delta()
        if tuple(delta.shape) != tuple(w.shape):
            raise PluginError(
                f"adapter {bp.parts['adapter'].name!r} from {bp.parts['adapter'].provenance}: "
                f"delta() of {name} has shape {tuple(delta.shape)}; it must be the matrix's, "
                f"{tuple(w.shape)}"
            )
        state[key] = (w.float() + delta.float()).to(w.dtype)
    first = next(model.parameters())
    with parameters_on_meta():
        plain = TransformerLM(plain_bp, device=first.device, dtype=first.dtype)
    if any(b.is_meta for b in plain.buffers()):
        plain = TransformerLM(plain_bp, device=first.device, dtype=first.dtype)
    assign(plain, {k: v.detach().clone() for k, v in state.items()}, first.device)
    plain.tokenizer = model.tokenizer
    return plain
