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


class PreNorm(nn.Module):
    """`y = x + attn(ln1(x)); z = y + ffn(ln2(y))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.ffn = norm(), attn, norm(), ffn

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y = x + self.attn(self.ln1(x), context)
        z: Tensor = y + self.ffn(self.ln2(y))
        return z


class PostNorm(nn.Module):
    """`y = ln1(x + attn(x)); z = ln2(y + ffn(y))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.ffn = norm(), attn, norm(), ffn

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y = self.ln1(x + self.attn(x, context))
        z: Tensor = self.ln2(y + self.ffn(y))
        return z


class Sandwich(nn.Module):
    """`y = x + ln1_out(attn(ln1(x))); z = y + ln2_out(ffn(ln2(y)))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm):
        super().__init__()
        self.ln1, self.attn, self.ln1_out = norm(), attn, norm()
        self.ln2, self.ffn, self.ln2_out = norm(), ffn, norm()

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y = x + self.ln1_out(self.attn(self.ln1(x), context))
        z: Tensor = y + self.ln2_out(self.ffn(self.ln2(y)))
        return z


class Reordered(nn.Module):
    """`y = x + ln1_out(attn(x)); z = y + ln2_out(ffn(y))`."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm):
        super().__init__()
        self.attn, self.ln1_out, self.ffn, self.ln2_out = attn, norm(), ffn, norm()

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        y = x + self.ln1_out(self.attn(x, context))
        z: Tensor = y + self.ln2_out(self.ffn(y))
        return z


class Parallel(nn.Module):
    """`z = ffn(ln2(x)) + attn(ln1(x)) + x`: both sub-layers read the same stream; with one
    norm (GPT-J) both read `ln1(x)`, with two (GPT-NeoX) each its own."""

    def __init__(self, *, attn: nn.Module, ffn: nn.Module, norm: Norm, norms: int = 1):
        super().__init__()
        self.ln1, self.attn = norm(), attn
        self.ln2 = norm() if norms == 2 else None
        self.ffn = ffn

    def forward(self, x: Float[Tensor, "B T d"], context: LayerContext) -> Float[Tensor, "B T d"]:
        h = self.ln1(x)
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


TABLE: tuple[Row, ...] = (
    Row("prenorm", PreNorm, lambda: ("ln1", "ln2"),
        "pre-norm: y = x + attn(ln1(x)), z = y + ffn(ln2(y))", True),
    Row("postnorm", PostNorm, lambda: ("ln1", "ln2"),
        "post-norm: y = ln1(x + attn(x)), z = ln2(y + ffn(y))", False),
    Row("sandwich", Sandwich, lambda: ("ln1", "ln1_out", "ln2", "ln2_out"),
        "norms before and after each sub-layer (Gemma 2)", False),
    Row("reordered", Reordered, lambda: ("ln1_out", "ln2_out"),
        "a norm on each sub-layer's output before the add (OLMo 2)", False),
    Row("parallel", Parallel, lambda norms: ("ln1",) if norms == 1 else ("ln1", "ln2"),
        "attention and ffn from the same input, one norm or two (GPT-J, GPT-NeoX)", True,
        (Arg("norms", int, 1, "1: one norm shared by both sub-layers (GPT-J); 2: one each "
             "(GPT-NeoX)", ge=1),)),
)  # fmt: skip


class Plugin:
    """The plugin object one entry point names: the hook that declares its row's block."""

    def __init__(self, row: Row):
        self.row = row

    @hookimpl
    def lmcore_components(self) -> list[Component]:
        row = self.row
        features = {"compile", "residual"} if row.residual else {"compile"}
        return [
            Component(
                kind="block",
                name=row.name,
                build=row.build,
                args=row.args,
                help=row.help,
                norms=row.norms,
                activations=lambda: 0,  # the adds keep nothing; the sub-layers count their own
                validate=_parallel_norms if row.name == "parallel" else None,
                shared_input=(lambda norms: norms == 1) if row.name == "parallel" else None,
                buffers=lambda: 0,
                features=frozenset(features),
            )
        ]


ROWS = {row.name: row for row in TABLE}
# The objects the entry points name (`prenorm = "lmcore_blocks:prenorm"`), one per row.
prenorm, postnorm, sandwich, reordered, parallel = (Plugin(row) for row in TABLE)
