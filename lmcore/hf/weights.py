"""Hugging Face tensor names and lmcore's state-dict keys, both ways: a family's `tensors` table
(`Weight` rows) and the layouts that turn one side's tensors into the other's.

A row names lmcore keys with `{i}` for the layer and `{e}` for the expert and the Hugging Face
tensor they come from; its layout says how:

    COPY           the same tensor
    ROTARY         q/k rows (weights, biases, q/k norm gains) permuted per head from the
                   half-split rotary layout to interleaved pairs (below)
    TRANSPOSE      GPT-2's Conv1D weights are (in, out), a linear layer's (out, in)
    Fused(...)     one tensor holding several lmcore tensors one after another (Phi-3's
                   qkv_proj and gate_up_proj; GPT-2's c_attn, transposed)
    PerHead(...)   GPT-NeoX's query_key_value: per head, its q, k and v rows in turn
    Experts(...)   every expert's tensors stacked in one Hugging Face tensor (gpt-oss's
                   experts.gate_up_proj: (E, d, 2·ff), gate and up columns interleaved)

A row whose lmcore keys have `{e}` and whose Hugging Face name has none holds every expert
(an `Experts` layout): its lmcore keys are those of expert 0, 1, ... in turn.

A row applies to a model when the model has all of its lmcore keys, so one table serves every
variant of a family (biases or not, q/k norms or not, dense or MoE layers). A Hugging Face
tensor no row takes is reported as unexpected, one a row needs as missing, one of another
shape as misshapen, all at once.

The rotary layouts: Hugging Face rotates dimension i of a head with i + r/2 (`rotate_half`, r
the rotated width), lmcore interleaved pairs (2k, 2k+1), both at frequency theta^(-2k/r).
lmcore row 2k of a head is Hugging Face row k, row 2k+1 is row k + r/2; rows from r on (a
partial rotation) stay. q and k permuted alike keep every attention score; a q/k norm's gain
is permuted with them (its mean of squares does not see the order).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol

import torch
from torch import Tensor

from lmcore.blueprint import Blueprint
from lmcore.errors import ConversionError
from lmcore.hf.family import Family

__all__ = [
    "COPY",
    "ROTARY",
    "TRANSPOSE",
    "Experts",
    "Fused",
    "Layout",
    "PerHead",
    "Rotation",
    "Weight",
    "from_hf_state_dict",
    "permute_from_hf",
    "permute_to_hf",
    "to_hf_state_dict",
]

Shape = tuple[int, ...]


class Rotation(NamedTuple):
    """The rotary permutation of one layer: its heads' width and the rotated part (0: none)."""

    head_dim: int
    rotary: int


def permute_from_hf(w: Tensor, heads: int, rotary: int | None = None) -> Tensor:
    """Rows of `heads` heads (dim 0; a weight, a bias or a norm gain) from the half-split
    rotary layout to interleaved pairs, the first `rotary` rows of each head (default all)."""
    d = w.shape[0] // heads
    r = d if rotary is None else rotary
    h = w.reshape(heads, d, *w.shape[1:])
    turned = h[:, :r].reshape(heads, 2, r // 2, *w.shape[1:]).transpose(1, 2)
    return torch.cat((turned.reshape(heads, r, *w.shape[1:]), h[:, r:]), 1).reshape(w.shape)


def permute_to_hf(w: Tensor, heads: int, rotary: int | None = None) -> Tensor:
    """The inverse of `permute_from_hf`."""
    d = w.shape[0] // heads
    r = d if rotary is None else rotary
    h = w.reshape(heads, d, *w.shape[1:])
    turned = h[:, :r].reshape(heads, r // 2, 2, *w.shape[1:]).transpose(1, 2)
    return torch.cat((turned.reshape(heads, r, *w.shape[1:]), h[:, r:]), 1).reshape(w.shape)


def _turn(t: Tensor, rot: Rotation, inverse: bool = False) -> Tensor:
    if not rot.rotary:
        return t
    heads = t.shape[0] // rot.head_dim
    return (permute_to_hf if inverse else permute_from_hf)(t, heads, rot.rotary)


class Layout(Protocol):
    """How one Hugging Face tensor holds a row's lmcore tensors (`shapes`: theirs in lmcore)."""

    def hf_shape(self, shapes: Sequence[Shape]) -> Shape: ...

    def split(self, t: Tensor, shapes: Sequence[Shape], rot: Rotation) -> list[Tensor]: ...

    def join(self, ts: Sequence[Tensor], rot: Rotation) -> Tensor: ...


@dataclass(frozen=True)
class _Copy:
    rotary: bool = False
    transpose: bool = False

    def hf_shape(self, shapes: Sequence[Shape]) -> Shape:
        return shapes[0][::-1] if self.transpose else shapes[0]

    def split(self, t: Tensor, shapes: Sequence[Shape], rot: Rotation) -> list[Tensor]:
        t = t.T if self.transpose and t.ndim == 2 else t
        return [_turn(t, rot) if self.rotary else t]

    def join(self, ts: Sequence[Tensor], rot: Rotation) -> Tensor:
        t = _turn(ts[0], rot, inverse=True) if self.rotary else ts[0]
        return t.T if self.transpose and t.ndim == 2 else t


COPY: Final[Layout] = _Copy()
ROTARY: Final[Layout] = _Copy(rotary=True)
TRANSPOSE: Final[Layout] = _Copy(transpose=True)


@dataclass(frozen=True)
class Fused:
    """lmcore tensors stacked along the output dimension in one Hugging Face tensor, each
    permuted for the rotation where `rotary` says so; `transpose`: the Hugging Face tensor is a
    Conv1D weight, (in, out)."""

    rotary: tuple[bool, ...]
    transpose: bool = False

    def hf_shape(self, shapes: Sequence[Shape]) -> Shape:
        out = (sum(s[0] for s in shapes), *shapes[0][1:])
        return out[::-1] if self.transpose and len(out) == 2 else out

    def split(self, t: Tensor, shapes: Sequence[Shape], rot: Rotation) -> list[Tensor]:
        t = t.T if self.transpose and t.ndim == 2 else t
        parts = torch.split(t, [s[0] for s in shapes], dim=0)
        return [_turn(p, rot) if r else p for p, r in zip(parts, self.rotary, strict=True)]

    def join(self, ts: Sequence[Tensor], rot: Rotation) -> Tensor:
        parts = [_turn(p, rot, True) if r else p for p, r in zip(ts, self.rotary, strict=True)]
        t = torch.cat(parts, dim=0)
        return t.T if self.transpose and t.ndim == 2 else t


@dataclass(frozen=True)
class PerHead:
    """GPT-NeoX's fused projection: for each head in turn, its rows of each lmcore tensor
    (q, k, v), `head_dim` rows each."""

    rotary: tuple[bool, ...]

    def hf_shape(self, shapes: Sequence[Shape]) -> Shape:
        return (sum(s[0] for s in shapes), *shapes[0][1:])

    def split(self, t: Tensor, shapes: Sequence[Shape], rot: Rotation) -> list[Tensor]:
        n, d = len(shapes), rot.head_dim
        heads = t.shape[0] // (n * d)
        grouped = t.reshape(heads, n, d, *t.shape[1:])
        parts = [grouped[:, j].reshape(heads * d, *t.shape[1:]) for j in range(n)]
        return [_turn(p, rot) if r else p for p, r in zip(parts, self.rotary, strict=True)]

    def join(self, ts: Sequence[Tensor], rot: Rotation) -> Tensor:
        parts = [_turn(p, rot, True) if r else p for p, r in zip(ts, self.rotary, strict=True)]
        d = rot.head_dim
        heads = parts[0].shape[0] // d
        grouped = [p.reshape(heads, 1, d, *p.shape[1:]) for p in parts]
        return torch.cat(grouped, dim=1).reshape(-1, *parts[0].shape[1:])


@dataclass(frozen=True)
class Experts:
    """Every expert's `parts` lmcore tensors in one Hugging Face tensor, expert e at index e of
    its first dimension; within an expert the parts one after another along the output
    dimension, or row by row in turn with `interleaved` (gpt-oss: gate 0, up 0, gate 1, ...);
    `transpose`: an expert's matrix is stored (in, out) (gpt-oss's `x @ W` experts)."""

    parts: int = 1
    interleaved: bool = False
    transpose: bool = False

    def _one(self, shapes: Sequence[Shape]) -> Shape:
        out = (sum(s[0] for s in shapes), *shapes[0][1:])
        return out[::-1] if self.transpose and len(out) == 2 else out

    def hf_shape(self, shapes: Sequence[Shape]) -> Shape:
        return (len(shapes) // self.parts, *self._one(shapes[: self.parts]))

    def split(self, t: Tensor, shapes: Sequence[Shape], rot: Rotation) -> list[Tensor]:
        out: list[Tensor] = []
        for e in range(t.shape[0]):
            one = t[e].T if self.transpose and t.ndim == 3 else t[e]
            mine = shapes[e * self.parts : (e + 1) * self.parts]
            if self.interleaved:
                out += [one[j :: self.parts] for j in range(self.parts)]
            else:
                out += list(torch.split(one, [s[0] for s in mine], dim=0))
        return out

    def join(self, ts: Sequence[Tensor], rot: Rotation) -> Tensor:
        experts = []
        for e in range(len(ts) // self.parts):
            mine = ts[e * self.parts : (e + 1) * self.parts]
            if self.interleaved:  # (rows, parts, ...) read row by row
                one = torch.stack(list(mine), dim=1).reshape(-1, *mine[0].shape[1:])
            else:
                one = torch.cat(list(mine), dim=0)
            experts.append(one.T if self.transpose and one.ndim == 2 else one)
        return torch.stack(experts)


@dataclass(frozen=True)
class Weight:
    """One row of a family's tensor table: lmcore keys (`{i}` layer, `{e}` expert), the
    Hugging Face name and the layout between them."""

    ours: tuple[str, ...]
    theirs: str
    layout: Layout = COPY


def weight(ours: str | tuple[str, ...], theirs: str, layout: Layout = COPY) -> Weight:
    return Weight((ours,) if isinstance(ours, str) else ours, theirs, layout)


class Pair(NamedTuple):
    ours: tuple[str, ...]
    theirs: str
    layout: Layout
    rotation: Rotation


def _rotation(bp: Blueprint) -> Rotation:
    """The rotary permutation a layer's q/k rows need: lmcore's rope rotates them, another
    positional encoding does not."""
    spec = bp.spec
    part = bp.parts["pos"]
    if part.name != "rope":
        return Rotation(spec.head_dim, 0)
    fraction = float(bp.kwargs("pos").get("fraction", 1.0))
    return Rotation(spec.head_dim, int(spec.head_dim * fraction))


def pairs(rows: Sequence[Weight], bp: Blueprint, keys: Mapping[str, Shape]) -> Iterator[Pair]:
    """The rows of a table that apply to a model whose state dict has `keys`, expanded over
    layers and (while the model has them) experts."""
    for row in rows:
        layered = any("{i}" in k for k in (*row.ours, row.theirs))
        for i in range(bp.spec.num_layers) if layered else [None]:
            rot = _rotation(bp.layer(i or 0))
            if "{e}" not in row.theirs and any("{e}" in k for k in row.ours):
                stacked = _every_expert(row.ours, i, keys)
                if stacked:
                    yield Pair(stacked, row.theirs.format(i=i), row.layout, rot)
                continue
            for e in range(1 << 20) if "{e}" in row.theirs else [None]:
                ours = tuple(k.format(i=i, e=e) for k in row.ours)
                if not all(k in keys for k in ours):
                    break
                yield Pair(ours, row.theirs.format(i=i, e=e), row.layout, rot)


def _every_expert(ours: Sequence[str], i: int | None, keys: Mapping[str, Shape]) -> tuple[str, ...]:
    """The keys of `ours` for expert 0, 1, ... in turn, while the model has them all."""
    found: list[str] = []
    for e in range(1 << 20):
        one = [k.format(i=i, e=e) for k in ours]
        if not all(k in keys for k in one):
            return tuple(found)
        found += one
    return tuple(found)


def _listed(groups: Sequence[tuple[str, Sequence[str]]]) -> str:
    return "; ".join(
        f"{label} ({len(names)}): {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
        for label, names in groups
        if names
    )


def from_hf_state_dict(
    family: Family,
    tensors: Mapping[str, Tensor],
    bp: Blueprint,
    shapes: Mapping[str, Shape],
    where: str = "the Hugging Face weights",
) -> dict[str, Tensor]:
    """Rename, split and permute a Hugging Face state dict of `family` (a `Family`) to the keys
    of `bp`'s model, whose state-dict shapes are `shapes`, strictly: every missing, unexpected
    and misshapen tensor is listed in one `ConversionError`, and so is any lmcore key the table
    does not fill."""
    prefix, head, embedding = family.prefix, family.head, family.embedding
    tensors = {
        k: v
        for k, v in tensors.items()
        if not k.endswith(family.skip) and not k.startswith(family.skip_prefixes)
    }
    if prefix and tensors and not any(k.startswith(prefix) for k in tensors):
        tensors = {k if k == head else prefix + k: v for k, v in tensors.items()}  # base model
    found = list(pairs(family.tensors, bp, shapes))
    embed = tensors.get(embedding)
    if bp.spec.tie_embeddings and embed is not None:
        tied = tensors.setdefault(head, embed)  # transformers leaves it out
        if tied is not embed and not (tied.shape == embed.shape and torch.equal(tied, embed)):
            raise ConversionError(
                f"{where}: tie_word_embeddings is true but {head} differs from {embedding}; set "
                "tie_word_embeddings to false in config.json"
            )
    wanted = {p.theirs for p in found}
    missing = [p.theirs for p in found if p.theirs not in tensors]
    unexpected = sorted(set(tensors) - wanted)
    misshapen = []
    for p in found:
        if p.theirs in tensors:
            expected = p.layout.hf_shape([shapes[k] for k in p.ours])
            if tuple(tensors[p.theirs].shape) != tuple(expected):
                misshapen.append(
                    f"{p.theirs} (file {tuple(tensors[p.theirs].shape)}, model {tuple(expected)})"
                )
    unfilled = sorted(set(shapes) - {k for p in found for k in p.ours})
    if missing or unexpected or misshapen or unfilled:
        shown = _listed(
            [
                ("missing", missing),
                ("unexpected", unexpected),
                ("wrong shape", misshapen),
                ("lmcore keys with no tensor", unfilled),
            ]
        )
        raise ConversionError(
            f"{where}: the tensors are not those of a {family.architecture} with this "
            f"config: {shown}"
        )
    state: dict[str, Tensor] = {}
    for p in found:
        parts = p.layout.split(tensors[p.theirs], [shapes[k] for k in p.ours], p.rotation)
        state.update(zip(p.ours, parts, strict=True))
    return state


def to_hf_state_dict(
    family: Family, state: Mapping[str, Tensor], bp: Blueprint
) -> dict[str, Tensor]:
    """lmcore's state dict of `bp`'s model under `family`'s Hugging Face names; with tied
    embeddings the output matrix is left out, as transformers saves it."""
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    found = list(pairs(family.tensors, bp, shapes))
    unfilled = sorted(set(state) - {k for p in found for k in p.ours})
    if unfilled:
        raise ConversionError(
            f"the {family.architecture} table has no Hugging Face tensor for "
            f"{', '.join(unfilled[:12])}"
        )
    out = {
        p.theirs: p.layout.join([state[k] for k in p.ours], p.rotation).contiguous() for p in found
    }
    if bp.spec.tie_embeddings:
        out.pop(family.head, None)
    return out
