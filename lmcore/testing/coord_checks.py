"""The coordinate check of muP (`lmcore.train.coordcheck`), on every component of the kinds that
build a model and on every parametrization:

- `coordinates`: in a one-layer model around the component, under ``parametrization=mup``
  (a parametrization under test: the registry's default components under it, at
  ``base_width=64`` when it takes that argument), how far a few
  AdamW steps move each activation (the embedding's output, the layer's, the logits) does not
  depend on the width: over widths 64 to 512 the slope of log mean |x_t - x_0| against log
  width is within ±`lmcore.train.coordcheck.TOLERANCE` for every activation.

A component fails it when its parameters' declared roles or its own init or multipliers do
not scale with the width as muP's rules assume (a hidden matrix declared a scalar keeps the
full learning rate, and its layer's update grows with the width).
"""

from __future__ import annotations

from typing import Final

from lmcore.components import KINDS
from lmcore.errors import LmcoreError
from lmcore.testing.core import Settings, Target, check, fail, model_buildable
from lmcore.testing.recipe_checks import spec_text, who
from lmcore.train.coordcheck import TOLERANCE, WIDTHS, coordinates

# The probe: one layer, a small vocabulary and d_ff = d_model / 2, so that the four widths'
# runs cost about a second; the learning rate is large enough that the updates, not the
# initial weights, set each activation's change after the few steps.
BASE: Final = "vocab_size=64, context_length=8, d_model=64, num_layers=1, num_heads=4, d_ff=32"
# The head at zeros: the logits' change is then all the updates' (at initialisation muP's
# logits shrink as 1/sqrt(width), which a few steps at small widths do not yet outweigh).
MUP: Final = "mup(base_width=64,zero_head=true)"
STEPS: Final = 3
LR: Final = 1e-2


def _needs(target: Target) -> str | None:
    """Why the check cannot run: a missing default component, muP or torch_adamw."""
    from lmcore.registry import get_registry

    reason = model_buildable(target) if target.kind in KINDS else None
    if reason:
        return reason
    if "nomup" in target.component.features:
        return f"{target.label} declares 'nomup': muP's rules do not hold for it, and it refuses them"
    registry = target.registry or get_registry()
    wanted = [("optimizer", "torch_adamw")]
    if target.kind != "parametrization":
        wanted.append(("parametrization", "mup"))
    missing = [f"{k} {n!r}" for k, n in wanted if n not in registry.names(k)]
    if missing:
        return (
            f"the coordinate check trains {target.label} with lmcore's built-in "
            f"{', '.join(missing)}, which the registry lacks"
        )
    return None


@check("coordinates", (*KINDS, "parametrization"), defaults_only=True, needs=_needs)
def check_coordinates(target: Target, variant: str, settings: Settings) -> None:
    """Under muP, how far a few training steps move each activation does not depend on the
    width (64 to 512)."""
    from lmcore.blueprint import resolve

    if target.kind == "parametrization":  # a base_width argument: the probe's, 64
        rules = spec_text(target)
        if target.component.arg("base_width") is not None and "base_width" not in rules:
            inner = rules[rules.index("(") + 1 : -1] + "," if "(" in rules else ""
            rules = f"{rules.split('(')[0]}({inner}base_width=64)"
        spec = BASE
    else:
        spec, rules = f"{BASE}, {target.kind}={spec_text(target)}", MUP
    try:
        bp = resolve(spec, target.registry)
        found = coordinates(bp, parametrization=rules, steps=STEPS, lr=LR, seed=settings.seed,
                            batch=2, seq=8)  # fmt: skip
    except LmcoreError as e:
        fail(f"{who(target)}: the coordinate check cannot build or train {spec}, "
             f"parametrization={rules} at widths {list(WIDTHS)}: {e}")  # fmt: skip
    for name, s in found.slopes().items():
        if abs(s) > TOLERANCE:
            shown = ", ".join(f"{w}: {v:.3g}" for w, v in zip(found.widths, found.scales[name],
                                                               strict=True))  # fmt: skip
            fail(
                f"{who(target)}: under parametrization={rules}, how far {STEPS} AdamW steps "
                f"move the {name} scales with the width: the slope of log mean |x_t - x_0| "
                f"against log width is {s:+.2f} (widths {shown}), outside ±{TOLERANCE}. muP's "
                "rules come from each parameter's declared role: a hidden matrix declared "
                "anything but matrix/packed keeps the full learning rate; declare the roles in "
                "parameter_roles() (lmcore.model.roles) and draw nothing that ignores the width"
            )
