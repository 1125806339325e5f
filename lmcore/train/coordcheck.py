"""The coordinate check (Tensor Programs V, §D.1): a model trained a few steps at several widths,
and how far training moved its activations, mean |x_t - x_0| of the embedding's output, of
each layer's, of each of the layer's sub-layers and norms and of the logits (muP's defining
property: every activation's update is Θ(1) in the width; at initialisation the hidden ones
are Θ(1) under both parametrizations). Under muP that scale does not depend on the width: the
slope of log scale against log width stays within `TOLERANCE` for every activation. Under the
standard parametrization it drifts (the sub-layers' and the logits' updates grow about in
proportion to the width).

    mup = coordinates(bp, widths=(64, 128, 256, 512), parametrization="mup(base_width=64)")
    sp = coordinates(bp, widths=(64, 128, 256, 512), parametrization=None)
    print(table(mup, sp)); plot(mup, sp, "coordcheck.png")

Each width is the spec with ``d_model`` set to it and ``d_ff`` (and an explicit ``head_dim``)
scaled in proportion, the number of heads kept; every width trains on the same seeded random
tokens (one batch, repeated) with AdamW at one learning rate, from the same seed. The kit
runs it on every component (`lmcore.testing.coord_checks`); `lmcore coordcheck SPEC` prints
the table and draws the plot.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import SpecError
from lmcore.model.nn import cross_entropy
from lmcore.model.parametrization import lr_multipliers
from lmcore.model.roles import roles_of
from lmcore.model.transformer import TransformerLM
from lmcore.registry import Registry
from lmcore.syntax import parse_value
from lmcore.train.recipe import build_optimizer, param_groups, resolve_recipe

__all__ = ["TOLERANCE", "WIDTHS", "Coordinates", "coordinates", "plot", "slope", "table"]

WIDTHS: Final = (64, 128, 256, 512)
# Under muP every activation's log-log slope against the width is within ±TOLERANCE: over
# 64 → 512 a scale that changes by less than 8^0.25 ≈ 1.7× (the noise of a few steps at the
# smallest width is well inside it; a hidden matrix without muP's learning-rate rule gives a
# slope near 1).
TOLERANCE: Final = 0.25
STEPS: Final = 5
LR: Final = 1e-2
BATCH: Final = 4
SEQ: Final = 16


@dataclass(frozen=True)
class Coordinates:
    """How far training moved each activation (mean |x_t - x_0|), one value per width."""

    label: str  # "muP" or "SP"
    widths: tuple[int, ...]
    scales: dict[str, tuple[float, ...]]  # activation -> its scale at each width

    def slopes(self) -> dict[str, float]:
        return {name: slope(self.widths, values) for name, values in self.scales.items()}


def slope(widths: Sequence[int], values: Sequence[float]) -> float:
    """The least-squares slope of log(value) against log(width)."""
    xs = [math.log(w) for w in widths]
    ys = [math.log(max(v, 1e-30)) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def at_width(bp: Blueprint, width: int, parametrization: str | None) -> Blueprint:
    """`bp`'s spec at d_model `width` (d_ff and an explicit head_dim in proportion, the heads
    kept) with `parametrization` (spec text; None: the standard one)."""
    s = bp.spec
    if s.layers:
        raise SpecError("the coordinate check takes a spec without per-layer values")
    ratio = width / s.d_model
    explicit_head = s.head_dim != s.d_model // s.num_heads
    explicit_scale = s.query_scale != s.default("query_scale")
    new = replace(
        s,
        d_model=width,
        d_ff=max(1, round(s.d_ff * ratio)),
        head_dim=max(1, round(s.head_dim * ratio)) if explicit_head else 0,
        query_scale=s.query_scale if explicit_scale else 0.0,
        parametrization=None,
    )
    text = str(new)
    if parametrization is not None:
        parse_value(parametrization)  # a malformed value is the spec's error, placed
        text += f",parametrization={parametrization}"
    return resolve(text, bp.registry)


def _activations(model: TransformerLM, ids: Tensor) -> dict[str, Tensor]:
    """The embedding's output, each layer's, each of its sub-layers' (``0.ffn``, ``0.attn``,
    ``0.ln1``: the block's children) and the logits, for `ids`."""
    found: dict[str, Tensor] = {}

    def keep(name: str) -> Any:
        def hook(module: Any, args: Any, out: Any) -> None:
            if isinstance(out, Tensor) and out.is_floating_point():
                found[name] = out.detach().clone()

        return hook

    hooks = [model.token_embeddings.register_forward_hook(keep("embedding"))]
    for i, layer in enumerate(model.layers):  # the layer, and each of its sub-layers and norms
        hooks.append(layer.register_forward_hook(keep(f"layer {i}")))
        for name, child in layer.named_children():
            hooks.append(child.register_forward_hook(keep(f"{i}.{name}")))
    try:
        with torch.no_grad():
            found["logits"] = model(ids).detach()
    finally:
        for h in hooks:
            h.remove()
    return found


def train_and_measure(
    bp: Blueprint, *, steps: int = STEPS, lr: float = LR, seed: int = 0, batch: int = BATCH,
    seq: int = SEQ, registry: Registry | None = None, optimizer: str = "torch_adamw",
) -> dict[str, float]:  # fmt: skip
    """`bp`'s model trained `steps` AdamW steps on one seeded batch of random tokens (the
    parametrization's per-role learning rates): the mean |x_t - x_0| of each activation, how
    far training moved it."""
    torch.manual_seed(seed)
    model = TransformerLM(bp)
    g = torch.Generator().manual_seed(seed + 1)
    seq = min(seq, bp.spec.context_length)
    data = torch.randint(0, bp.spec.vocab_size, (batch, seq + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    groups, _ = param_groups(model, roles_of(model), decay=(), weight_decay=0.0, lr=lr,
                             multipliers=lr_multipliers(model))  # fmt: skip
    part = resolve_recipe("optimizer", optimizer, registry or bp.registry)
    opt = build_optimizer(part, groups, lr=lr, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-12)
    before = _activations(model, x)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        torch.autograd.backward(cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
        opt.step()
    after = _activations(model, x)
    return {name: (after[name] - before[name]).abs().mean().item() for name in after}


def coordinates(
    bp: Blueprint, *, widths: Sequence[int] = WIDTHS, parametrization: str | None,
    label: str = "", **train: Any,
) -> Coordinates:  # fmt: skip
    """The coordinate check of `bp`'s model under `parametrization` (None: standard)."""
    rows = [train_and_measure(at_width(bp, w, parametrization), **train) for w in widths]
    names = list(rows[0])
    return Coordinates(
        label or ("SP" if parametrization is None else "muP"),
        tuple(widths),
        {n: tuple(r[n] for r in rows) for n in names},
    )


def table(*runs: Coordinates) -> str:
    """Each activation's scale per width and its slope, one block per run."""
    lines = []
    for run in runs:
        head = "  ".join(f"{w:>9}" for w in run.widths)
        lines.append(f"{run.label:<10}  {head}     slope")
        for name, values in run.scales.items():
            cells = "  ".join(f"{v:>9.4g}" for v in values)
            lines.append(f"{name:<10}  {cells}  {slope(run.widths, values):>+8.3f}")
    return "\n".join(lines)


def plot(runs: Sequence[Coordinates], path: str | os.PathLike[str], title: str = "") -> Path:
    """Side-by-side log-log panels, one per run: each activation's scale against the width."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5 * len(runs), 4), layout="constrained")
    axes = fig.subplots(1, len(runs), squeeze=False, sharey=True)[0]
    for ax, run in zip(axes, runs, strict=True):
        for name, values in run.scales.items():
            ax.plot(
                run.widths, values, marker="o", label=f"{name} ({slope(run.widths, values):+.2f})"
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("width (d_model)")
        ax.set_title(run.label)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("mean |x_t - x_0| after training")
    if title:
        fig.suptitle(title)
    out = Path(path)
    fig.savefig(out, dpi=100)
    return out
