"""adapter=lora: low-rank adaptation (Hu et al., 2021), written from scratch.

For a targeted matrix W (out × in) the update is ``ΔW x = (alpha / rank) · B A x`` with A
(rank × in) drawn as torch's linear layer draws its weight (Kaiming-uniform, a = √5, as PEFT
does) or from a normal of σ = 1/rank (``init=gaussian``) and B (out × rank) zeros, so the model's
logits are unchanged at initialisation. A packed matrix (fused q/k/v: `splits`) gets one
low-rank pair per logical matrix: merged, it is what LoRA on the separate matrices gives
(and what Hugging Face and GGUF, which store them apart, can hold).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

from lmcore import Arg, Component, hookimpl
from lmcore.model.roles import MATRIX, Role, packed


class LoRA(nn.Module):
    """`x ↦ (alpha/rank) · B A x` per logical matrix; `delta()` is the same as a matrix."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        splits: Sequence[int],
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        init: str = "kaiming",
        targets: str = "matrix,packed",  # read by lmcore (which matrices), not here
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.splits = tuple(int(s) for s in splits)
        self.rank, self.scale, self.dropout = rank, alpha / rank, dropout
        k = len(self.splits)
        self.lora_A = nn.Parameter(torch.empty(k * rank, in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=dtype))
        if init == "gaussian":
            nn.init.normal_(self.lora_A, std=1.0 / rank)
        else:  # each pair's A as torch's linear layer (in → rank) initialises its weight
            for a in self.lora_A.data.split(rank):
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        if self.training and self.dropout > 0:  # inverted dropout on the adapter's input
            x = x * (torch.rand_like(x) >= self.dropout) / (1.0 - self.dropout)
        z = x @ self.lora_A.T  # (..., k·rank)
        if len(self.splits) == 1:
            return (z @ self.lora_B.T) * self.scale
        parts = zip(z.split(self.rank, dim=-1), self.lora_B.split(self.splits), strict=True)
        return torch.cat([zi @ bi.T for zi, bi in parts], dim=-1) * self.scale

    def delta(self) -> Float[Tensor, "d_out d_in"]:
        pairs = zip(self.lora_B.split(self.splits), self.lora_A.split(self.rank), strict=True)
        return torch.cat([b @ a for b, a in pairs]) * self.scale

    def parameter_roles(self) -> dict[str, Role]:
        if len(self.splits) == 1:
            return {"lora_A": MATRIX, "lora_B": MATRIX}
        return {"lora_A": packed(*[self.rank] * len(self.splits)), "lora_B": packed(*self.splits)}

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scale={self.scale:g}, splits={list(self.splits)}"


def _params(in_features: int, out_features: int, splits: Sequence[int], rank: int) -> int:
    return len(splits) * rank * in_features + out_features * rank


def _flops(
    in_features: int, out_features: int, splits: Sequence[int], rank: int, seq_len: int
) -> int:
    return 2 * seq_len * _params(in_features, out_features, splits, rank)


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="adapter",
            name="lora",
            build=LoRA,
            args=(
                Arg("rank", int, 8, "the update's rank r", ge=1),
                Arg("alpha", float, 16.0, "the update is scaled by alpha / rank", gt=0.0),
                Arg("targets", str, "matrix,packed", "roles and/or module names, comma-"
                    'separated (quote a list: targets="q_proj,v_proj")'),
                Arg("dropout", float, 0.0, "dropout on the adapter's input while training",
                    ge=0.0),
                Arg("init", str, "kaiming", "A's initialisation (B starts at zeros)",
                    choices=("kaiming", "gaussian")),
            ),  # fmt: skip
            params=_params,
            flops=_flops,
            validate=_validate,
            help="low-rank adaptation: W x + (alpha/rank) B A x, B at zeros, the base frozen",
            features=frozenset(),
        )
    ]


def _validate(dropout: float) -> None:
    if not dropout < 1.0:
        raise ValueError(f"dropout must be < 1, got {dropout!r}")
