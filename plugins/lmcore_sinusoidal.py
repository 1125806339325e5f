"""pos=sinusoidal: the fixed absolute encoding of Vaswani et al. (2017), §3.5, added to the token
embeddings.

    PE[pos, 2i] = sin(pos / base^(2i/d_model)),   PE[pos, 2i+1] = cos(pos / base^(2i/d_model))

No √d_model scaling of the embeddings: the CS336 token embeddings already have σ=1 entries, and
the table's have RMS 1/√2.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import PositionalEncodingBase


class SinusoidalPositionalEncoding(PositionalEncodingBase):
    """Adds `table[token_positions]`; the `(context_length, d_model)` table is a non-persistent
    float32 buffer, so the state dict holds nothing."""

    table: Tensor  # (context_length, d_model)

    def __init__(
        self,
        d_model: int,
        context_length: int,
        base: float = 10000.0,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal encodings fill sin/cos pairs; d_model={d_model} is odd")
        if device is not None and torch.device(device).type == "meta":
            # The table's shape only, as RoPE's: nothing computed or allocated, no operator run.
            table = torch.empty(context_length, d_model, dtype=torch.float32, device="meta")
        else:
            # Computed on the CPU and moved, as RoPE's tables are.
            two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # 2i
            inv_freq = 1.0 / (base ** (two_i / d_model))  # (d_model/2,)
            pos = torch.arange(context_length, dtype=torch.float32)
            angles = pos[:, None] * inv_freq[None, :]  # (context_length, d_model/2)
            # Interleave: even columns sin, odd columns cos.
            table = torch.stack((torch.sin(angles), torch.cos(angles)), dim=-1).flatten(-2)
            table = table.to(device)  # (context_length, d_model)
        self.register_buffer("table", table, persistent=False)

    def embed(
        self, x: Float[Tensor, "B T d_model"], token_positions: Int[Tensor, "B T"]
    ) -> Float[Tensor, "B T d_model"]:
        return x + self.table[token_positions].to(x.dtype)  # (B or 1, T, d_model) broadcasts


def _check(d_model: int) -> None:
    if d_model % 2:
        raise ValueError(
            f"sinusoidal encodings fill (sin, cos) pairs, but d_model={d_model} is odd; "
            "use an even d_model, or pos=learned"
        )


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="pos",
            name="sinusoidal",
            build=SinusoidalPositionalEncoding,
            args=(Arg("base", float, 10000.0, "base of the wavelengths", gt=0.0),),
            help="fixed sin/cos absolute positions added to the token embeddings (Vaswani 2017)",
            activations=lambda: 0,  # a fixed table: nothing that needs a gradient
            buffers=lambda context_length, d_model: 4 * context_length * d_model,  # float32
            # The float32 positions, the angles and their sines and cosines, before the stack.
            temporaries=lambda context_length, d_model: 4 * context_length * (1 + 3 * d_model // 2),
            features=frozenset({"absolute", "compile"}),
            validate=_check,
        )
    ]
