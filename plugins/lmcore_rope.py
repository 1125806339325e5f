"""pos=rope: rotary position embeddings (Su et al., 2021), CS336 §3.4.3, interleaved pairs.

Options beyond CS336, each off by default: `fraction` rotates only the first
`int(head_dim · fraction)` dimensions of each head and passes the rest through (GPT-NeoX's
`rotary_pct`, Phi's `partial_rotary_factor`); `scaling=linear` divides every frequency by
`factor` (position interpolation); `scaling=llama3` divides the low frequencies by `factor`,
keeps the high ones and blends in between (Llama 3.1's `rope_scaling`); `scaling=yarn` (YaRN,
Peng et al. 2023: gpt-oss, DeepSeek-V3) interpolates the low frequencies by `factor`, keeps the
high ones, ramps linearly between the dimensions that turn `beta_slow` and `beta_fast` times
over `original_context_length`, and multiplies cos and sin by an attention factor; all as
Hugging Face's `modeling_rope_utils` computes them.
"""

from __future__ import annotations

from typing import Final

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lmcore import Arg, Component, hookimpl
from lmcore.components import format_scalar
from lmcore.interfaces import PositionalEncodingBase, Rotation
from lmcore.model.rotary import SCALINGS, inverse_frequencies, rotary_dim, yarn_attention_factor


class RotaryPositionalEmbedding(PositionalEncodingBase):
    """Rotates each pair `(x[2k], x[2k+1])` by `pos / theta^(2k/d)`; the same for every head.

    `d` is the rotated width, `rotary_dim` (default all of `d_k`): the first `rotary_dim`
    dimensions of each head are rotated, the others pass through unchanged. The cos/sin
    tables are non-persistent buffers of shape `(max_seq_len, rotary_dim/2)`, kept in float32
    whatever the model dtype. A pair is rotated as the complex number `x[2k] + i·x[2k+1]` times
    `cos + i·sin`. `scaling` ("none", "linear", "llama3", "yarn") rescales the frequencies; see
    `inverse_frequencies`. `attention_factor` multiplies cos and sin (YaRN's; 1: none).
    """

    def __init__(
        self,
        theta: float,
        d_k: int,
        max_seq_len: int,
        device: torch.device | str | None = None,
        *,
        rotary_dim: int | None = None,
        scaling: str = "none",
        factor: float = 1.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        original_context_length: int = 8192,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        truncate: bool = True,
        attention_factor: float = 1.0,
    ):
        super().__init__()
        if d_k % 2 and rotary_dim in (None, d_k):
            raise ValueError(f"RoPE rotates pairs of dimensions; d_k={d_k} is odd")
        rotary_dim = d_k if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= d_k:
            raise ValueError(
                f"RoPE rotates pairs of dimensions; rotary_dim={rotary_dim} must be even and "
                f"within 2..d_k={d_k}"
            )
        self.theta, self.d_k, self.max_seq_len = theta, d_k, max_seq_len
        self.rotary_dim = rotary_dim
        shape = (max_seq_len, rotary_dim // 2)
        if device is not None and torch.device(device).type == "meta":
            # A meta build gets the tables' shapes only: nothing is computed or allocated, and
            # no operator runs (torch's first meta operator costs about a second of imports).
            cos, sin = (torch.empty(shape, dtype=torch.float32, device="meta") for _ in "cs")
        else:
            # Computed on the CPU and moved: the same numbers on every device.
            inv_freq = inverse_frequencies(
                theta,
                rotary_dim,
                scaling=scaling,
                factor=factor,
                low_freq_factor=low_freq_factor,
                high_freq_factor=high_freq_factor,
                original_context_length=original_context_length,
                beta_fast=beta_fast,
                beta_slow=beta_slow,
                truncate=truncate,
            )  # (rotary_dim/2,)
            pos = torch.arange(max_seq_len, dtype=torch.float32)
            angles = pos[:, None] * inv_freq[None, :]  # (max_seq_len, rotary_dim/2)
            cos, sin = torch.cos(angles), torch.sin(angles)
            if attention_factor != 1.0:  # YaRN's: q·k of the rotated part grows by its square
                cos, sin = cos * attention_factor, sin * attention_factor
            cos, sin = cos.to(device), sin.to(device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(
        self, x: Float[Tensor, "... seq d_k"], token_positions: Int[Tensor, "... seq"]
    ) -> Float[Tensor, "... seq d_k"]:
        """Rotate `x` at `token_positions` (the CS336 `run_rope` signature)."""
        return self._rotator(self.cos[token_positions], self.sin[token_positions])(x)

    def rotation(self, token_positions: Int[Tensor, "B T"]) -> Rotation:
        # Gathered once per forward; every layer reuses them for q and k.
        cos = self.cos[token_positions][:, None]  # (B, 1, T, rotary_dim/2): broadcast over heads
        sin = self.sin[token_positions][:, None]
        return self._rotator(cos, sin)

    def _rotator(self, cos: Tensor, sin: Tensor) -> Rotation:
        # The compiler fuses the real form into one loop; eagerly, the complex form is one pass.
        # Chosen where it is applied: a rotation made eagerly may be applied in compiled code
        # (compile_decoding compiles the layers, not the step's positions).
        if torch.compiler.is_compiling():
            whole: Rotation = lambda x: _rotate_real(x, cos, sin)  # noqa: E731
        else:
            turns = torch.complex(cos, sin)  # the unit complex number each pair is multiplied by
            whole = lambda x: (  # noqa: E731
                _rotate_real(x, cos, sin) if torch.compiler.is_compiling() else _rotate(x, turns)
            )
        if self.rotary_dim == self.d_k:
            return whole
        rot = self.rotary_dim
        # The rotated part and the rest, joined again; the rest passes through unchanged.
        return lambda x: torch.cat((whole(x[..., :rot]), x[..., rot:]), dim=-1)


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


# The scalings each frequency argument applies with.
_USED_BY: Final = {
    "factor": ("linear", "llama3", "yarn"),
    "low_freq_factor": ("llama3",),
    "high_freq_factor": ("llama3",),
    "original_context_length": ("llama3", "yarn"),
    **dict.fromkeys(
        ("beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"),
        ("yarn",),
    ),
}


def _check(
    head_dim: int,
    fraction: float,
    scaling: str,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context_length: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
    attention_factor: float,
    mscale: float,
    mscale_all_dim: float,
) -> None:
    if fraction > 1.0:
        raise ValueError(
            f"fraction={fraction} is the share of each head to rotate, at most 1.0 (all of it)"
        )
    rot = rotary_dim(head_dim, fraction)
    if fraction == 1.0 and head_dim % 2:
        raise ValueError(
            f"RoPE rotates pairs of dimensions, but head_dim = d_model / num_heads = {head_dim} "
            "is odd; pick d_model and num_heads with an even quotient, or use pos=nope"
        )
    if rot % 2 or rot < 2:
        raise ValueError(
            f"RoPE rotates pairs of dimensions, but int(head_dim · fraction) = "
            f"int({head_dim} · {fraction}) = {rot} is {'odd' if rot % 2 else 'less than 2'}; "
            "pick a fraction whose rotated width is even, or use pos=nope"
        )
    given = {
        "factor": (factor, 1.0),
        "low_freq_factor": (low_freq_factor, 1.0),
        "high_freq_factor": (high_freq_factor, 4.0),
        "original_context_length": (original_context_length, 8192),
        "beta_fast": (beta_fast, 32.0),
        "beta_slow": (beta_slow, 1.0),
        "truncate": (truncate, True),
        "attention_factor": (attention_factor, 0.0),
        "mscale": (mscale, 0.0),
        "mscale_all_dim": (mscale_all_dim, 0.0),
    }
    for name, (value, default) in given.items():
        if scaling not in _USED_BY[name] and value != default:
            needs = " or ".join(f"scaling={x}" for x in _USED_BY[name])
            raise ValueError(
                f"{name}={format_scalar(value)} has no effect with scaling={scaling}; it applies "
                f"with {needs} (or drop {name})"
            )
    if scaling == "yarn" and not beta_fast > beta_slow:
        raise ValueError(
            f"scaling=yarn ramps between the dimensions turning beta_slow and beta_fast times, so "
            f"beta_fast={beta_fast} must exceed beta_slow={beta_slow}"
        )
    if scaling == "llama3" and not high_freq_factor > low_freq_factor:
        raise ValueError(
            f"scaling=llama3 blends between low_freq_factor and high_freq_factor, so "
            f"high_freq_factor={high_freq_factor} must exceed low_freq_factor={low_freq_factor}"
        )


def _build(
    theta: float,
    head_dim: int,
    context_length: int,
    fraction: float,
    scaling: str,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context_length: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
    attention_factor: float,
    mscale: float,
    mscale_all_dim: float,
    device: torch.device | str | None = None,
) -> RotaryPositionalEmbedding:
    return RotaryPositionalEmbedding(
        theta,
        head_dim,
        context_length,
        device=device,
        rotary_dim=rotary_dim(head_dim, fraction),
        scaling=scaling,
        factor=factor,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        original_context_length=original_context_length,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
        attention_factor=(
            yarn_attention_factor(factor, attention_factor, mscale, mscale_all_dim)
            if scaling == "yarn"
            else 1.0
        ),
    )


ARGS: Final = (
    Arg("theta", float, 10000.0, "base of the rotation frequencies", gt=0.0),
    Arg(
        "fraction",
        float,
        1.0,
        "share of each head rotated: the first int(head_dim · fraction) dimensions",
        gt=0.0,
        written="changed",
    ),
    Arg(
        "scaling",
        str,
        "none",
        "frequency scaling: none, linear (all / factor), llama3 (Llama 3.1's) or yarn (YaRN)",
        choices=SCALINGS,
        written="changed",
    ),
    Arg(
        "factor",
        float,
        1.0,
        "linear, llama3 and yarn: how much longer the context gets",
        gt=0.0,
        written="changed",
    ),
    Arg(
        "low_freq_factor",
        float,
        1.0,
        "llama3: wavelengths above original / this are scaled",
        gt=0.0,
        written="changed",
    ),
    Arg(
        "high_freq_factor",
        float,
        4.0,
        "llama3: wavelengths below original / this are kept",
        gt=0.0,
        written="changed",
    ),
    Arg(
        "original_context_length",
        int,
        8192,
        "llama3 and yarn: the context length the model was trained at",
        ge=1,
        written="changed",
    ),
    Arg(
        "beta_fast",
        float,
        32.0,
        "yarn: dimensions turning more often than this over the original context are kept",
        gt=0.0,
        written="changed",
    ),
    Arg(
        "beta_slow",
        float,
        1.0,
        "yarn: dimensions turning less often than this are divided by factor",
        gt=0.0,
        written="changed",
    ),
    Arg(
        "truncate",
        bool,
        True,
        "yarn: round the ramp's ends to whole dimensions (gpt-oss: false)",
        written="changed",
        applies_with=(("scaling", "yarn"), ("factor", 4.0), ("original_context_length", 8)),
    ),
    Arg(
        "attention_factor",
        float,
        0.0,
        "yarn: cos and sin multiplied by this; 0: 0.1·ln(factor) + 1 (or by mscale)",
        ge=0.0,
        written="changed",
    ),
    Arg(
        "mscale",
        float,
        0.0,
        "yarn, with mscale_all_dim: the attention factor's numerator's ln weight (DeepSeek)",
        ge=0.0,
        written="changed",
    ),
    Arg(
        "mscale_all_dim",
        float,
        0.0,
        "yarn, with mscale: the attention factor's denominator's ln weight (DeepSeek)",
        ge=0.0,
        written="changed",
    ),
)


def _activations(seq_len: int, head_dim: int, fraction: float, num_layers: int) -> int:
    """cos + i·sin gathered at the positions, (1, T, rotary_dim / 2) complex64, gathered once
    per forward and kept by the rotation of q and k in every layer; nothing in a model none of
    whose layers attends (`num_layers` 0). A partial rotation also keeps nothing more: the
    concatenation saves no tensor."""
    return 4 * seq_len * rotary_dim(head_dim, fraction) if num_layers else 0


@hookimpl
def lmcore_components() -> list[Component]:
    return [
        Component(
            kind="pos",
            name="rope",
            build=_build,
            args=ARGS,
            help="rotary embeddings on q and k, interleaved pairs",
            activations=_activations,
            # cos and sin, (context_length, rotary_dim / 2) float32 each, whatever the dtype.
            buffers=lambda context_length, head_dim, fraction: (
                8 * context_length * (rotary_dim(head_dim, fraction) // 2)
            ),
            # What the tables are computed from: the float32 positions and angles.
            temporaries=lambda context_length, head_dim, fraction: (
                4 * context_length * (1 + rotary_dim(head_dim, fraction) // 2)
            ),
            features=frozenset({"rotary", "relative", "compile"}),
            validate=_check,
        )
    ]
