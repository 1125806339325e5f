"""The adapter kind's contracts, on a small model of the registry's default components with the
adapter applied as a spec applies it (``adapter=NAME(...)``, `lmcore.model.adapters`):

- `init`: the adapted model's logits are those of the same base without it (the update starts
  at zero);
- `trainable`: the base is frozen and a backward pass reaches every adapter parameter and no
  base one; the adapter's parameters have roles;
- `merge`: with the adapter's parameters moved off their initial values, the merged model
  (``W + delta()``, `lmcore.adapting.merged`) gives the adapted model's logits within
  tolerance: `delta()` is the update the forward applies;
- `state`: the adapter's state dict, through safetensors, loads into a freshly built adapted
  model, which then gives the same logits.

Every failure message names the component, the distribution it comes from and what is wrong.
"""

from __future__ import annotations

from typing import Final

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes
from torch import Tensor, nn

from lmcore.errors import LmcoreError
from lmcore.testing.core import Settings, Target, check, fail, first_line, model_buildable
from lmcore.testing.recipe_checks import spec_text, who

# The probe model: the registry's default components at a small shape.
SPEC: Final = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64"
VOCAB: Final = 97
ATOL: Final = 1e-5
MERGE_TOL: Final = 1e-4  # float32 adds of a rank-r product: relative to the logits' scale


def build(target: Target, seed: int = 1234, adapter: bool = True) -> nn.Module:
    """The probe model (seeded: the same base every time), with the target as its adapter."""
    from lmcore.model.transformer import build_model

    spec = f"{SPEC}, adapter={spec_text(target)}" if adapter else SPEC
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            return build_model(spec, registry=target.registry)
        except LmcoreError as e:
            fail(f"{who(target)}: a model with adapter={spec_text(target)} cannot be built: "
                 f"{first_line(e)}")  # fmt: skip


def ids() -> Tensor:
    return torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(5678))


def adapter_params(model: nn.Module) -> dict[str, nn.Parameter]:
    from lmcore.model.adapters import ATTR

    return {n: p for n, p in model.named_parameters() if f".{ATTR}." in f".{n}"}


def moved(model: nn.Module) -> None:
    """Every adapter parameter set to seeded random values (off the zeros it starts at)."""
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in adapter_params(model).values():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


@check("init", ("adapter",), needs=model_buildable)
def init(target: Target, variant: str, settings: Settings) -> None:
    """At initialisation the adapted model's logits are the base's."""
    base, adapted = build(target, adapter=False), build(target)
    with torch.no_grad():
        a, b = adapted(ids()), base(ids())
    worst = (a - b).abs().max().item()
    if not worst <= ATOL:
        fail(
            f"{who(target)}: at initialisation it changes the model's logits (max |diff| "
            f"{worst:.3g} > {ATOL}); an adapter's update must start at zero (LoRA: B = 0) so "
            "that fine-tuning starts from the base model"
        )


@check("trainable", ("adapter",), needs=model_buildable)
def trainable(target: Target, variant: str, settings: Settings) -> None:
    """The base frozen; gradients reach every adapter parameter and no base one."""
    from lmcore.model.roles import roles_of

    model = build(target)
    ours = adapter_params(model)
    if not ours:
        fail(f"{who(target)}: its modules hold no parameters: there is nothing to train")
    thawed = [n for n, p in model.named_parameters() if p.requires_grad and n not in ours]
    if thawed:
        fail(f"{who(target)}: base parameters are trainable after it is applied: "
             f"{', '.join(thawed[:3])}")  # fmt: skip
    frozen = [n for n, p in ours.items() if not p.requires_grad]
    if frozen:
        fail(
            f"{who(target)}: its parameters {', '.join(frozen[:3])} do not require gradients; "
            "lmcore trains only the adapter, so it must"
        )
    try:
        roles_of(model)
    except LmcoreError as e:
        fail(f"{who(target)}: {first_line(e)}")
    moved(model)  # LoRA's A gets no gradient while B is zero
    model(ids()).float().square().mean().backward()
    dead = [n for n, p in ours.items() if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    if dead:
        fail(
            f"{who(target)}: a backward pass through the model leaves {', '.join(dead[:3])} "
            "without a gradient: its output does not depend on them (is forward using them?)"
        )


@check("merge", ("adapter",), needs=model_buildable)
def merge(target: Target, variant: str, settings: Settings) -> None:
    """Merged (W + delta()) = unmerged, within tolerance."""
    from lmcore.adapting import merged

    model = build(target)
    moved(model)
    with torch.no_grad():
        want = model(ids())
        try:
            plain = merged(model)
        except LmcoreError as e:
            fail(f"{who(target)}: merging it fails: {first_line(e)}")
        got = plain(ids())
    worst = (got - want).abs().max().item()
    scale = max(1.0, want.abs().max().item())
    if not worst <= MERGE_TOL * scale:
        fail(
            f"{who(target)}: the merged model's logits differ from the adapted model's by "
            f"{worst:.3g} (max |diff|, tolerance {MERGE_TOL * scale:.3g}); delta() must be the "
            "matrix its forward applies: forward(x) == x @ delta().T"
        )


@check("state", ("adapter",), needs=model_buildable)
def state(target: Target, variant: str, settings: Settings) -> None:
    """Its state dict, through safetensors, loads into a fresh adapted model: same logits."""
    from lmcore.model.adapters import adapter_state

    model = build(target)
    moved(model)
    saved = load_bytes(save_bytes({k: v.contiguous() for k, v in adapter_state(model).items()}))
    fresh = build(target, seed=4321)  # built from other random numbers: all must come back
    try:
        fresh.load_state_dict({**model.state_dict(), **saved}, strict=True)
    except (RuntimeError, LmcoreError) as e:
        fail(f"{who(target)}: its state dict does not load back: {first_line(e)}")
    with torch.no_grad():
        worst = (fresh(ids()) - model(ids())).abs().max().item()
    if worst != 0.0:
        fail(
            f"{who(target)}: after its state dict is loaded into a fresh model the logits differ "
            f"by {worst:.3g}: part of its state is not in state_dict() (a plain attribute "
            "instead of a parameter or persistent buffer?)"
        )
