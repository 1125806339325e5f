"""pos=rope: rotary position embeddings (Su et al., 2021), CS336 §3.4.3, interleaved pairs."""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lmcore import Arg, Component, hookimpl
from lmcore.interfaces import PositionalEncodingBase, Rotation


class RotaryPositionalEmbedding(PositionalEncodingBase):
    """Rotates each pair `(x[2k], x[2k+1])` by `pos / theta^(2k/d_k)`; the same for every head.

    The cos/sin tables are non-persistent buffers of shape `(max_seq_len, d_k/2)`, kept in
    float32 whatever the model dtype. A pair is rotated as the complex number
    `x[2k] + i·x[2k+1]` times `cos + i·sin`.
    """

    def __init__(
        self,
        theta: float,
        d_k: int,
        max_seq_len: int,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if d_k % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions; d_k={d_k} is odd")
        self.theta, self.d_k, self.max_seq_len = theta, d_k, max_seq_len
        shape = (max_seq_len, d_k // 2)
        if device is not None and torch.device(device).type == "meta":
            # A meta build gets the tables' shapes only: nothing is computed or allocated, and
            # no operator runs (torch's first meta operator costs about a second of imports).
            cos, sin = (torch.empty(shape, dtype=torch.float32, device="meta") for _ in "cs")
        else:
            # Computed on the CPU and moved: the same numbers on every device.
            k = torch.arange(0, d_k, 2, dtype=torch.float32)  # 2k
            inv_freq = 1.0 / (theta ** (k / d_k))  # (d_k/2,)
            pos = torch.arange(max_seq_len, dtype=torch.float32)
            angles = pos[:, None] * inv_freq[None, :]  # (max_seq_len, d_k/2)
            cos, sin = torch.cos(angles).to(device), torch.sin(angles).to(device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(
        self, x: Float[Tensor, "... seq d_k"], token_positions: Int[Tensor, "... seq"]
    ) -> Float[Tensor, "... seq d_k"]:
        """Rotate `x` at `token_positions` (the CS336 `run_rope` signature)."""
        return self._rotator(self.cos[token_positions], self.sin[token_positions])(x)

    def rotation(self, token_positions: Int[Tensor, "B T"]) -> Rotation:
        # Gathered once per forward; every layer reuses them for q and k.
        cos = self.cos[token_positions][:, None]  # (B, 1, T, d_k/2): broadcast over heads
        sin = self.sin[token_positions][:, None]
        return self._rotator(cos, sin)

    @staticmethod
    def _rotator(cos: Tensor, sin: Tensor) -> Rotation:
        if torch.compiler.is_compiling():  # the compiler fuses the real form into one loop
            return lambda x: _rotate_real(x, cos, sin)
        turns = torch.complex(cos, sin)  # the unit complex number each pair is multiplied by
        return lambda x: _rotate(x, turns)


def _rotate(x: Tensor, turns: Tensor) -> Tensor:
    """Each pair `(x[2k], x[2k+1])` read as the complex number `x[2k] + i·x[2k+1]` and multiplied
    by `turns[k]`: one pass over x in eager mode, where rotating the even and odd halves apart
    and re-interleaving them takes six (and is several times slower on a strided q or k)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (..., d_k/2, 2)
    if pairs.storage_offset() % 2 or any(st % 2 for st in pairs.stride()[:-1]):
        pairs = pairs.clone(memory_format=torch.contiguous_format)  # view_as_complex needs it
    rotated = torch.view_as_complex(pairs) * turns
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)


def _rotate_real(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The same rotation in real arithmetic, for torch.compile."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()  # (..., seq, d_k/2)
    out = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)  # re-interleave the pairs


def _check(head_dim: int) -> None:
    if head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of dimensions, but head_dim = d_model / num_heads = {head_dim} "
            "is odd; pick d_model and num_heads with an even quotient, or use pos=nope"
        )


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="pos",
            name="rope",
            build=lambda theta, head_dim, context_length, device=None: RotaryPositionalEmbedding(
                theta, head_dim, context_length, device=device
            ),
            args=(Arg("theta", float, 10000.0, "base of the rotation frequencies", gt=0.0),),
            help="rotary embeddings on q and k, interleaved pairs",
            # cos + i·sin gathered at the positions, (1, T, head_dim / 2) complex64, gathered
            # once per forward and kept by the rotation of q and k in every layer.
            activations=lambda seq_len, head_dim: 4 * seq_len * head_dim,
            # cos and sin, (context_length, head_dim / 2) float32 each, whatever the dtype.
            buffers=lambda context_length, head_dim: 8 * context_length * (head_dim // 2),
            features=frozenset({"rotary", "relative", "compile"}),
            validate=_check,
        )
    ]
