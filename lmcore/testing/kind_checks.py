"""The contracts particular to one kind: a norm or ffn maps each token on its own (`per_token`);
a block holds its parts where its declaration says (`keys`) and mixes tokens only causally,
through attention, passing its residual stream unchanged when it declares so (`residual`); a
positional encoding declares what its hooks do (`features`) and, when 'relative', depends on
offsets only (`relative`). The attention kernels' own are in `lmcore.testing.attention_checks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from lmcore.interfaces import LayerContext, PositionalEncoding
from lmcore.testing.core import (
    BATCH,
    CHANGED,
    SEQ,
    SHORT,
    TOKENWISE,
    Settings,
    Target,
    check,
    fail,
    hooks,
    make_inputs,
    mismatch,
    model_buildable,
    norm_names,
    positions,
    shape_of,
)

# ------------------------------------------------------------------------------ norm and ffn


@check("per_token", TOKENWISE)
def per_token(target: Target, variant: str, settings: Settings) -> None:
    """Each (..., d_model) vector is mapped on its own: no mixing across tokens or batch rows."""
    module = target.build()
    x = make_inputs(target, lead=(3,))["x"]  # (B, 3, T, d_model)
    token = (1, 2, SEQ - 3)
    nudged = x.clone()
    nudged[token] += torch.randn(x.shape[-1])
    with torch.no_grad():
        changed = (module(nudged) - module(x)).abs().amax(dim=-1) > CHANGED
    changed[token] = False
    if bool(changed.any()):
        other = tuple(int(i) for i in changed.nonzero()[0])
        fail(
            f"changing the input vector at index {token} changed the output at {other}: a "
            f"{target.kind} maps each (..., d_model) vector on its own; reduce over the last "
            "dimension only (dim=-1, keepdim=True)"
        )


# ------------------------------------------------------------------------------ blocks


@check("keys", ("block",), needs=model_buildable)
def keys(target: Target, variant: str, settings: Settings) -> None:
    """The state dict holds `attn.*`, `ffn.*`, one set of norm keys per name its `norms`
    declaration gives, and its own parameters: the parts it is given, each once, where the
    declaration says."""
    module = target.build()
    names = norm_names(target)
    state = module.state_dict()
    tops = {key.split(".", 1)[0] for key in state}
    for part in ("attn", "ffn"):
        if part not in tops:
            fail(
                f"its state dict has no {part}.* keys (it has {sorted(tops)}); keep the "
                f"{part} it is given as the attribute `{part}`"
            )
    missing = [
        n for n in names if n not in tops and any(True for _ in _norm(module, n).parameters())
    ]
    if missing:
        fail(
            f"its norms declaration names {list(names)}, but the state dict has no keys under "
            f"{missing}; keep each norm built with norm() as the attribute of that name"
        )
    parts = {id(m) for n in ("attn", "ffn", *names) for m in _norm(module, n).modules()}
    stray = [
        n
        for n, child in module.named_children()
        if n not in ("attn", "ffn", *names) and any(id(m) in parts for m in child.modules())
    ]
    if stray:
        fail(
            f"it holds its parts a second time, as {stray}: each of attn, ffn and the norms "
            "appears once in the state dict"
        )


def _norm(module: nn.Module, name: str) -> nn.Module:
    found = getattr(module, name, None)
    if not isinstance(found, nn.Module):
        fail(f"it has no submodule {name!r}, which its norms declaration names")
    return found


class _Zero(nn.Module):
    """A sub-layer that gives zeros (of its input's shape, through the input for autograd)."""

    def forward(self, x: Tensor, *rest: Any) -> Tensor:
        return x * 0


@check("residual", ("block",), needs=model_buildable)
def residual(target: Target, variant: str, settings: Settings) -> None:
    """Tokens mix only through attention, causally: the output at a position does not change
    when a later position's input does, and changes with its own. With the 'residual' feature,
    the block returns its input exactly when attn and ffn give zeros."""
    module = target.build()
    x = make_inputs(target)["x"]  # (B, T, d_model)
    cut = SEQ // 2
    later = x.clone()
    later[:, cut:] += torch.randn_like(later[:, cut:])
    with torch.no_grad():
        base, moved = module(x, LayerContext()), module(later, LayerContext())
    early = (moved[:, :cut] - base[:, :cut]).abs().max().item()
    if early > CHANGED:
        fail(
            f"changing the inputs from position {cut} on changed the output before it (by "
            f"{early:.3g}): a block mixes tokens only through its attention sub-layer, "
            "which is causal"
        )
    if not (moved[:, cut:] - base[:, cut:]).abs().max().item() > CHANGED:
        fail(f"changing the inputs from position {cut} on left the output there unchanged")
    if "residual" not in target.features:
        return
    module.attn, module.ffn = _Zero(), _Zero()
    with torch.no_grad():
        out = module(x, LayerContext())
    problem = mismatch(out, x, atol=0.0, rtol=0.0)
    if problem:
        fail(
            f"declares 'residual', but with attn and ffn giving zeros the output is not its "
            f"input: {problem}; the residual stream must pass through the block unchanged, or "
            "drop 'residual' from the Component's features"
        )


# ------------------------------------------------------------------------------ positions


@check("features", ("pos",))
def features(target: Target, variant: str, settings: Settings) -> None:
    """The declared features match what the hooks do: 'rotary' ⇔ rotation, 'bias' ⇔
    attention_bias, 'absolute' ⇔ embed changes x."""
    pos = hooks(target.build())
    i = make_inputs(target)
    x, p = i["x"], i["positions"]
    with torch.no_grad():
        does = {
            "rotary": ("rotation(positions) returns a function", pos.rotation(p) is not None),
            "bias": ("attention_bias returns a tensor", pos.attention_bias(p, p) is not None),
            "absolute": ("embed(x, positions) changes x", not torch.equal(pos.embed(x, p), x)),
        }
    for feature, (hook, happens) in does.items():
        if feature in target.features and not happens:
            fail(
                f"declares {feature!r}, but it is not true that {hook}; implement the hook or "
                f"drop {feature!r} from the Component's features"
            )
        if happens and feature not in target.features:
            fail(
                f"{hook}, but the Component does not declare {feature!r}; add it to features, "
                "so that specs can check what the encoding needs (an attention bias needs an "
                "attn kernel with 'bias')"
            )


@check("relative", ("pos",), feature="relative")
def relative(target: Target, variant: str, settings: Settings) -> None:
    """Relative: shifting every position by a constant changes no q·k score after rotation, no
    attention bias and no embedding."""
    pos = hooks(target.build())
    s = shape_of(target)
    heads, d = s["num_heads"], s["head_dim"]
    p = positions(BATCH, SEQ)
    shifted = p + torch.tensor([[3], [11]])  # a different shift per row, within the context
    q, k = torch.randn(BATCH, heads, SEQ, d), torch.randn(BATCH, heads, SEQ, d)
    x = torch.randn(BATCH, SEQ, s["d_model"])
    atol, rtol = 1e-4, 1e-4  # float32 rotation tables at positions up to ~30
    with torch.no_grad():
        for what, a, b in _relative_pairs(pos, p, shifted, q, k, x):
            problem = mismatch(b, a, atol=atol, rtol=rtol)
            if problem:
                fail(
                    f"declares 'relative', but {what} changes when every position is shifted "
                    f"by a constant (3 in row 0, 11 in row 1): {problem}; it must depend only "
                    "on the offset between query and key positions, or drop 'relative'"
                )


def _relative_pairs(
    pos: PositionalEncoding, p: Tensor, shifted: Tensor, q: Tensor, k: Tensor, x: Tensor
) -> Iterator[tuple[str, Tensor, Tensor]]:
    """(what, at positions p, at shifted positions) for each hook the encoding implements."""
    yield "embed(x, positions)", pos.embed(x, p), pos.embed(x, shifted)
    rot, rot_shifted = pos.rotation(p), pos.rotation(shifted)
    if rot is not None and rot_shifted is not None:
        scores = rot(q) @ rot(k).transpose(-2, -1)
        scores_shifted = rot_shifted(q) @ rot_shifted(k).transpose(-2, -1)
        yield "q·k after rotation(positions)", scores, scores_shifted
    for q_pos, q_shifted in ((p, shifted), (p[:, -SHORT:], shifted[:, -SHORT:])):
        b, b_shifted = pos.attention_bias(q_pos, p), pos.attention_bias(q_shifted, shifted)
        if b is not None and b_shifted is not None:
            yield f"attention_bias ({q_pos.shape[1]} queries)", b, b_shifted
