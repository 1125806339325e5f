"""parametrization=mup: the maximal update parametrization (Yang et al., Tensor Programs V, 2022),
in the form of its Table 8 (the formulation with an output multiplier, equivalent to Table 3's,
which lets the embedding and the head be tied), for Adam-family optimizers.

With m = d_model / base_width (every hidden width, d_ff and head_dim, scales with d_model; the
number of heads does not), by role (`lmcore.model.roles`), σ the init std and η the lr multiple:

=========  =================================================  =====  ========================
role       σ                                                  η      why
=========  =================================================  =====  ========================
matrix,    sqrt(2 / (in/m + out/m)) / sqrt(m) (the standard   1/m    hidden: var ∝ 1/fan_in,
packed     σ at base width, ∝ 1/sqrt(fan_in); per logical            Adam lr ∝ 1/fan_in
           matrix of a packed tensor)
router     sqrt(2 / (in/m + out)) / m                         1/m    output-like (fan_out
                                                                     fixed): Table 3's output
embedding  1 (untied); tied: sqrt(2 / (base_width + vocab))   1      input: constant
head       sqrt(2 / (base_width + vocab)); 0 with zero_head   1      output, multiplier 1/m
gain, bias, scalar, conv: the component's own init            1      vectors
=========  =================================================  =====  ========================

The logits are multiplied by 1/m (base_width / d_model); the attention's query scale by
1/sqrt(m), so 1/sqrt(head_dim) at base width becomes sqrt(base_head_dim) / head_dim: 1/d.
At m = 1 every σ, η and multiplier is the standard parametrization's (the draws differ: they
are made again). Tied embeddings: the one matrix is an input weight (constant σ, the head's
at base width; η 1) and the logits keep the output multiplier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmcore import Arg, Component, hookimpl
from lmcore.model.roles import Role


@dataclass(frozen=True)
class MuP:
    """muP's rules for one model (`lmcore.model.parametrization.Parametrization`)."""

    d_model: int
    vocab_size: int
    tie_embeddings: bool = False
    base_width: int = 256
    zero_head: bool = False

    @property
    def width_mult(self) -> float:
        return self.d_model / self.base_width

    @property
    def output_multiplier(self) -> float:
        return 1.0 / self.width_mult

    @property
    def query_factor(self) -> float:
        return 1.0 / math.sqrt(self.width_mult)

    def init_std(self, role: Role, shape: tuple[int, ...]) -> float | None:
        m = self.width_mult
        if role.name in ("matrix", "packed", "router"):
            fan_in, fan_out = shape[role.fan_in], shape[role.fan_out]  # type: ignore[index]
            if role.name == "router":  # experts do not scale: σ ∝ 1/fan_in (Table 3's output)
                return math.sqrt(2.0 / (fan_in / m + fan_out)) / m
            return math.sqrt(2.0 / (fan_in / m + fan_out / m)) / math.sqrt(m)
        base_head = math.sqrt(2.0 / (self.base_width + self.vocab_size))
        if role.name == "embedding":
            return base_head if self.tie_embeddings else 1.0
        if role.name == "head":
            return 0.0 if self.zero_head else base_head
        return None  # gains, biases, scalars, filters: width-independent, as built

    def lr_scale(self, role: Role) -> float:
        return 1.0 / self.width_mult if role.name in ("matrix", "packed", "router") else 1.0


def _zero() -> int:
    return 0


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="parametrization",
            name="mup",
            build=MuP,
            args=(
                Arg("base_width", int, 256, "d_model where muP is the standard one", ge=1),
                Arg("zero_head", bool, False, "initialise the output head at zeros (TP V)"),
            ),
            params=_zero,
            flops=_zero,
            help="maximal update parametrization (TP V, Table 8): init, per-role Adam lr "
            "and output/attention multipliers by width, so a tuned lr transfers",
        )
    ]
