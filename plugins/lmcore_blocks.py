"""The built-in blocks, an entry point per row: prenorm, postnorm, sandwich, reordered, parallel.

A block wires one layer's norms, attention and feed-forward network around the residual stream
(`lmcore.interfaces.Block`). Each row below is one small module: it receives `attn`, `ffn` and
`norm` (a function building one more of the model's norms per call) and registers them in the
order its state dict lists them. Names: `ln1` / `ln2` normalise the attention / feed-forward
sub-layer's input (post-norm: its sum with the stream), `ln1_out` / `ln2_out` its output.

    prenorm    y = x + attn(ln1(x));           z = y + ffn(ln2(y))          (CS336, Llama)
    postnorm   y = ln1(x + attn(x));           z = ln2(y + ffn(y))          (the 2017 original)
    sandwich   y = x + ln1_out(attn(ln1(x)));  z = y + ln2_out(ffn(ln2(y)))  (Gemma 2)
    reordered  y = x + ln1_out(attn(x));       z = y + ln2_out(ffn(y))      (OLMo 2)
    parallel   z = ffn(ln2(x)) + attn(ln1(x)) + x, with norms=1: ln2 is ln1  (GPT-J, GPT-NeoX)

None holds parameters of its own, computes matmuls or keeps tensors for backward besides its
sub-layers', so each declares zero of all three; lmcore accounts the norms it names.

`ffn=none` (registered here, with the blocks that wire it): a layer with no feed-forward sub-layer
(Mamba-2's layers: a norm and the mixer). Every block is then built with `feed_forward=False`
(`lmcore.blueprint.Blueprint.kwargs`): it neither calls the ffn nor builds the ffn's norms (`ln2`,
`ln2_out`), so the layer holds, computes and counts nothing for it. It still holds the empty ffn
module as `ffn` (no parameters, no state-dict keys), as every block holds its ffn.

    prenorm    y = x + attn(ln1(x))
    postnorm   y = ln1(x + attn(x))
    sandwich   y = x + ln1_out(attn(ln1(x)))
    reordered  y = x + ln1_out(attn(x))
    parallel   y = attn(ln1(x)) + x
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import LayerContext

Norm = Callable[[], nn.Module]


class NoFeedForward(nn.Module):
    """`ffn=none`: no feed-forward sub-layer. Holds nothing; the built-in blocks never call it
    (`feed_forward=False`), and a block that does gets zeros, so its sum with the stream is the
    stream."""

    def __init__(self, d_model: int, d_ff: int, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):  # fmt: skip
        super().__init__()

    def forward(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]:
        return torch.zeros_like(x)


def _ffn_norm(norm: Norm, feed_forward: bool) -> nn.Module | None:
    """A norm of the feed-forward sub-layer, when the layer has one."""
    return norm() if feed_forward else None


class PreNorm(nn.Module):
    """`y = x + attn(ln1(x)); z = y + ffn(ln2(y))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm, feed_forward: bool = True):
        super().__init__()
        self.ln1, self.attn = norm(), attn
        self.ln2, self.ffn = _ffn_norm(norm, feed_forward), ffn

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y: Tensor = x + self.attn(self.ln1(x), context)
        if self.ln2 is None:  # ffn=none
            return y
        z: Tensor = y + self.ffn(self.ln2(y))
        return z


class PostNorm(nn.Module):
    """`y = ln1(x + attn(x)); z = ln2(y + ffn(y))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm, feed_forward: bool = True):
        super().__init__()
        self.ln1, self.attn = norm(), attn
        self.ln2, self.ffn = _ffn_norm(norm, feed_forward), ffn

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y: Tensor = self.ln1(x + self.attn(x, context))
        if self.ln2 is None:  # ffn=none
            return y
        z: Tensor = self.ln2(y + self.ffn(y))
        return z


class Sandwich(nn.Module):
    """`y = x + ln1_out(attn(ln1(x))); z = y + ln2_out(ffn(ln2(y)))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm, feed_forward: bool = True):
        super().__init__()
        self.ln1, self.attn, self.ln1_out = norm(), attn, norm()
        self.ln2, self.ffn = _ffn_norm(norm, feed_forward), ffn
        self.ln2_out = _ffn_norm(norm, feed_forward)

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y: Tensor = x + self.ln1_out(self.attn(self.ln1(x), context))
        if self.ln2 is None or self.ln2_out is None:  # ffn=none
            return y
        z: Tensor = y + self.ln2_out(self.ffn(self.ln2(y)))
        return z


class Reordered(nn.Module):
    """`y = x + ln1_out(attn(x)); z = y + ln2_out(ffn(y))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm, feed_forward: bool = True):
        super().__init__()
        self.attn, self.ln1_out = attn, norm()
        self.ffn, self.ln2_out = ffn, _ffn_norm(norm, feed_forward)

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y: Tensor = x + self.ln1_out(self.attn(x, context))
        if self.ln2_out is None:  # ffn=none
            return y
        z: Tensor = y + self.ln2_out(self.ffn(y))
        return z


class Parallel(nn.Module):
    """`z = ffn(ln2(x)) + attn(ln1(x)) + x`: both sub-layers read the same stream; with one
    norm (GPT-J) both read `ln1(x)`, with two (GPT-NeoX) each its own."""

    def __init__(
        self, *, attn: nn.Module, ffn: nn.Module, norm: Norm, norms: int = 1,
        feed_forward: bool = True,
    ):  # fmt: skip
        super().__init__()
        self.ln1, self.attn = norm(), attn
        self.ln2 = norm() if norms == 2 and feed_forward else None
        self.ffn = ffn
        self.feed_forward = feed_forward

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        h = self.ln1(x)
        if not self.feed_forward:  # ffn=none
            y: Tensor = self.attn(h, context) + x
            return y
        # Each norm keeps its own input for backward, so that each keeps what it declares: a
        # second norm reads a copy when there is a backward to keep it for.
        copy = x.clone() if torch.is_grad_enabled() and self.ln2 is not None else x
        g = h if self.ln2 is None else self.ln2(copy)
        # The ffn first: with one norm, the tensor both read is then kept for backward as the
        # ffn's input (declared `shared_input`), and the attention's projections keep no copy.
        f = self.ffn(g)
        a = self.attn(h, context)
        z: Tensor = f + a + x  # GPT-NeoX's order of the sum
        return z

    def extra_repr(self) -> str:
        return f"norms={1 if self.ln2 is None else 2}"


def _parallel_norms(norms: int) -> None:
    if norms not in (1, 2):
        raise ValueError(
            f"norms={norms}: a parallel block has one norm shared by attention and the "
            "feed-forward network (norms=1, GPT-J) or one each (norms=2, GPT-NeoX)"
        )


@dataclass(frozen=True)
class Row:
    name: str
    build: Callable[..., nn.Module]
    norms: Callable[..., tuple[str, ...]]
    help: str
    residual: bool  # the stream passes unchanged when both sub-layers give zeros, whatever the norm
    args: tuple[Arg, ...] = ()


def _norms(*names: str) -> Callable[..., tuple[str, ...]]:
    """A row's norms declaration: `names`, less the feed-forward sub-layer's (`ln2*`) when the
    layer has none (`ffn=none`)."""

    def declared(feed_forward: bool = True) -> tuple[str, ...]:
        return tuple(n for n in names if feed_forward or not n.startswith("ln2"))

    return declared


def _shared(norms: int, feed_forward: bool = True) -> bool:
    """One norm feeds both sub-layers: its output is kept once, as the ffn's input (with no
    ffn, the attention's projections keep it)."""
    return norms == 1 and feed_forward


def _parallel_names(norms: int, feed_forward: bool = True) -> tuple[str, ...]:
    return ("ln1",) if norms == 1 or not feed_forward else ("ln1", "ln2")


TABLE: tuple[Row, ...] = (
    Row("prenorm", PreNorm, _norms("ln1", "ln2"),
        "pre-norm: y = x + attn(ln1(x)), z = y + ffn(ln2(y))", True),
    Row("postnorm", PostNorm, _norms("ln1", "ln2"),
        "post-norm: y = ln1(x + attn(x)), z = ln2(y + ffn(y))", False),
    Row("sandwich", Sandwich, _norms("ln1", "ln1_out", "ln2", "ln2_out"),
        "norms before and after each sub-layer (Gemma 2)", False),
    Row("reordered", Reordered, _norms("ln1_out", "ln2_out"),
        "a norm on each sub-layer's output before the add (OLMo 2)", False),
    Row("parallel", Parallel, _parallel_names,
        "attention and ffn from the same input, one norm or two (GPT-J, GPT-NeoX)", True,
        (Arg("norms", int, 1, "1: one norm shared by both sub-layers (GPT-J); 2: one each "
             "(GPT-NeoX)", ge=1),)),
)  # fmt: skip


# ffn=none: the layer has no feed-forward sub-layer (the blocks above then wire none).
NO_FFN = Component(
    kind="ffn",
    name="none",
    build=NoFeedForward,
    help="no feed-forward sub-layer: the block wires only the mixer and its norms (Mamba-2)",
    params=lambda: 0,
    flops=lambda: 0,
    activations=lambda: 0,
    default_d_ff=lambda: 1,  # d_ff means nothing here; 1 when not given
    features=frozenset({"compile", "empty"}),
)


class Plugin:
    """The plugin object one entry point names: the hook that declares its row's block (and
    `extra` components: prenorm's entry point also declares `ffn=none`)."""

    def __init__(self, row: Row, extra: tuple[Component, ...] = ()):
        self.row = row
        self.extra = extra

    @hookimpl
    def lmcore_components(self) -> list[Component]:
        row = self.row
        features = {"compile", "residual"} if row.residual else {"compile"}
        return [
            *self.extra,
            Component(
                kind="block",
                name=row.name,
                build=row.build,
                args=row.args,
                help=row.help,
                norms=row.norms,
                activations=lambda: 0,  # the adds keep nothing; the sub-layers count their own
                validate=_parallel_norms if row.name == "parallel" else None,
                shared_input=_shared if row.name == "parallel" else None,
                buffers=lambda: 0,
                features=frozenset(features),
            )
        ]


ROWS = {row.name: row for row in TABLE}
# The objects the entry points name (`prenorm = "lmcore_blocks:prenorm"`), one per row.
prenorm, postnorm, sandwich, reordered, parallel = (
    Plugin(row, (NO_FFN,) if row.name == "prenorm" else ()) for row in TABLE
)
