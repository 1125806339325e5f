"""Activation recomputation (checkpointing): parts of every layer whose forward runs again in
backward instead of keeping what it saved.

    apply_recompute(model, "layers")         # each whole layer
    apply_recompute(model, "mixer,ffn")      # the token mixer and the FFN, not the norms
    apply_recompute(model, "layers:mamba2")  # the layers whose mixer is mamba2 (a hybrid)

The grammar (`--recompute` of `lmcore train`, `lmcore describe`): comma-separated targets,
each `layers` (`all` is the same), `mixer` or `ffn`, optionally `:MIXER` to take only the
layers whose token mixer is that component. `layers` without a mixer covers the others, so
it stands alone. A recomputed part keeps its input and nothing of what runs inside it: in
backward its forward runs again (`torch.utils.checkpoint`, non-reentrant, the RNG state
restored), so gradients are the same and peak memory is each part's input plus one part's
activations at a time. Wrapping is in place: parameter names and the state dict do not
change, and a distributed wrapper (DDP, FSDP2's `fully_shard`) goes outside it. Without
gradients (evaluation, generation) the forward runs as it is.

No torch at import: the command line checks the grammar without it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final

from lmcore.errors import LmcoreError, did_you_mean

if TYPE_CHECKING:
    from torch import nn

__all__ = ["TARGETS", "RecomputeError", "apply_recompute", "parse_recompute", "targets"]

TARGETS: Final = ("layers", "mixer", "ffn")
_ALIASES: Final = {"all": "layers"}
# The attribute a block keeps each target under (`lmcore.model.transformer.build_layer`).
_ATTRIBUTE: Final = {"layers": "", "mixer": "attn", "ffn": "ffn"}


class RecomputeError(LmcoreError, ValueError):
    """A `--recompute` value that is not the grammar, or names a mixer the model has none of."""


def parse_recompute(text: str) -> tuple[tuple[str, str | None], ...]:
    """`(target, mixer or None)` for each comma-separated item of `text`, in order, without
    repeats; `RecomputeError` names an item that is not one, with a did-you-mean."""
    found: dict[tuple[str, str | None], None] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        target, sep, mixer = (s.strip() for s in item.partition(":"))
        target = _ALIASES.get(target, target)
        if target not in TARGETS:
            raise RecomputeError(
                f"--recompute {text!r}: {target!r} is not a target; targets are "
                f"{', '.join(TARGETS)} (or all), each optionally :MIXER, e.g. layers, mixer,ffn, "
                "layers:attention" + did_you_mean(target, (*TARGETS, *_ALIASES))
            )
        if sep and not mixer.isidentifier():
            raise RecomputeError(
                f"--recompute {text!r}: {item!r} names no mixer after ':'; write TARGET:MIXER "
                "with a mixer's name, e.g. layers:attention"
            )
        found[(target, mixer or None)] = None
    if not found:
        raise RecomputeError(
            f"--recompute {text!r}: names no target; give {', '.join(TARGETS)} (or all)"
        )
    if ("layers", None) in found:  # every whole layer: the parts of one are inside it
        return (("layers", None),)
    return tuple(found)


def targets(text: str) -> str:
    """`text` written canonically (`RecomputeError` when it is not the grammar)."""
    return ",".join(t if m is None else f"{t}:{m}" for t, m in parse_recompute(text))


def plan(mixers: list[str], text: str) -> list[tuple[int, str]]:
    """`(layer, target)` for each part of a model whose layers' mixers are `mixers` that `text`
    recomputes, a layer's whole block taking the place of its parts; `RecomputeError` for a
    `:MIXER` no layer has."""
    items = parse_recompute(text)
    for _, mixer in items:
        if mixer is not None and mixer not in mixers:
            have = list(dict.fromkeys(mixers))
            raise RecomputeError(
                f"--recompute {text!r}: no layer's mixer is {mixer!r}; this model's mixers are "
                f"{', '.join(have)}" + did_you_mean(mixer, have)
            )
    out: list[tuple[int, str]] = []
    for i, name in enumerate(mixers):
        chosen = {t for t, m in items if m is None or m == name}
        if "layers" in chosen:
            out.append((i, "layers"))
            continue
        out += [(i, t) for t in TARGETS if t in chosen]
    return out


def apply_recompute(model: nn.Module, text: str) -> list[str]:
    """Recompute the parts of `model` (a `TransformerLM`) that `text` names, in place; the paths
    of the modules wrapped (`layers.0`, `layers.0.attn`, ...)."""
    layers: Any = model.layers
    blueprint: Any = model.blueprint
    mixers = [blueprint.layer(i).parts["mixer"].name for i in range(len(layers))]
    paths = []
    for i, target in plan(mixers, text):
        attribute = _ATTRIBUTE[target]
        module = layers[i] if not attribute else getattr(layers[i], attribute)
        checkpointed(module)
        paths.append(f"layers.{i}" + (f".{attribute}" if attribute else ""))
    return paths


def checkpointed(module: nn.Module) -> nn.Module:
    """`module`, its forward recomputed in backward (`torch.utils.checkpoint`, non-reentrant)
    whenever gradients are on; in place, once."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if getattr(module, "_lmcore_recomputed", False):
        return module
    forward = module.forward

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = run  # type: ignore[method-assign]
    module._lmcore_recomputed = True  # type: ignore[assignment]
    return module
