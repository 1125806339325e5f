"""mixer=attention_mamba2: attention and Mamba-2 side by side in one layer (Falcon-H1).

    y = attention_out · attn(attention_in · x) + ssm_out · ssm(ssm_in · x)

Both read the layer's normalised input; their outputs are summed, each with its multiplier
(Falcon-H1's `attention_in_multiplier`, `attention_out_multiplier`, `ssm_in_multiplier`,
`ssm_out_multiplier`). `attn` is lmcore's attention sub-layer (projections, rotation, the
`attn=` kernel and every attention key of the spec, accounted by lmcore); `ssm` is the `mamba2`
mixer's layer with its own arguments. The decoding state is both: keys and values that grow with
the context, and Mamba-2's fixed-size state (a `CompoundState`), so a cache of this layer
cannot go back to an earlier token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

import lmcore_mamba2 as mamba2
from lmcore import Arg, Component, hookimpl
from lmcore.components import call_with
from lmcore.interfaces import LayerContext
from lmcore.model.cache import CompoundState

MULTIPLIERS = ("attention_in", "attention_out", "ssm_in", "ssm_out")


class AttentionMamba2(nn.Module):
    """`attention_out · attn(attention_in · x) + ssm_out · ssm(ssm_in · x)`; state-dict keys
    `attn.*` (lmcore's attention) and `ssm.*` (Mamba-2's, as transformers' `mamba.*`)."""

    def __init__(
        self,
        *,
        attn: nn.Module,
        ssm: nn.Module,
        attention_in: float = 1.0,
        attention_out: float = 1.0,
        ssm_in: float = 1.0,
        ssm_out: float = 1.0,
    ):
        super().__init__()
        self.attn, self.ssm = attn, ssm
        self.attention_in, self.attention_out = attention_in, attention_out
        self.ssm_in, self.ssm_out = ssm_in, ssm_out

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        cache = context.cache
        attn_context = context if cache is None else context._replace(cache=cache.part("attn"))
        ssm_context = context if cache is None else context._replace(cache=cache.part("ssm"))
        # Each branch gets its own scaled copy of x (even at 1.0): the two keep distinct inputs
        # for backward, as the accounting counts them.
        a = self.attn(x * self.attention_in, attn_context)
        s = self.ssm(x * self.ssm_in, ssm_context)
        y: Tensor = a * self.attention_out + s * self.ssm_out
        return y

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> CompoundState:
        made = {"batch": batch, "context_length": context_length, "device": device,
                "dtype": dtype}  # fmt: skip
        return CompoundState(
            {"attn": self.attn.decoding_state(**made), "ssm": self.ssm.decoding_state(**made)}
        )

    def extra_repr(self) -> str:
        return ", ".join(f"{m}={getattr(self, m)}" for m in MULTIPLIERS)


def build(
    *,
    attention: Callable[[], nn.Module],
    attention_in: float = 1.0,
    attention_out: float = 1.0,
    ssm_in: float = 1.0,
    ssm_out: float = 1.0,
    **ssm: Any,
) -> AttentionMamba2:
    return AttentionMamba2(
        attn=attention(), ssm=call_with(mamba2.build, ssm), attention_in=attention_in,
        attention_out=attention_out, ssm_in=ssm_in, ssm_out=ssm_out,
    )  # fmt: skip


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="mixer",
            name="attention_mamba2",
            build=build,
            args=(
                *mamba2.ARGS,
                Arg("attention_in", float, 1.0, "scales the attention's input (Falcon-H1's "
                    "attention_in_multiplier)"),
                Arg("attention_out", float, 1.0, "scales the attention's output "
                    "(attention_out_multiplier)"),
                Arg("ssm_in", float, 1.0, "scales Mamba-2's input (ssm_in_multiplier)"),
                Arg("ssm_out", float, 1.0, "scales Mamba-2's output (ssm_out_multiplier)"),
            ),  # fmt: skip
            help="attention and Mamba-2 side by side, their outputs summed (Falcon-H1)",
            # Mamba-2's own rows; lmcore counts the attention sub-layer at `attn` itself.
            params=mamba2.params,
            flops=mamba2.flops,
            activations=mamba2.activations,
            buffers=lambda: 0,
            state=mamba2.state,
            validate=mamba2.validate,
            attention=lambda: ("attn",),
            # documents: both parts keep documents apart (its kernel must declare it too).
            features=frozenset({"compile", "mask", "documents"}),
        )
    ]
