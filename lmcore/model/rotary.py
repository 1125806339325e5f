"""Rotary frequencies: `1 / theta^(2k/dim)` and the scalings that stretch a model's context
(linear position interpolation, Llama 3.1's, YaRN's), with YaRN's attention factor, computed as
Hugging Face's `modeling_rope_utils` computes them, for the same float32 numbers. The rope
positional encoding (`pos=rope`) and the mixers that rotate their own heads (`mixer=mla`) share
them.
"""

from __future__ import annotations

import math
from typing import Final

import torch
from torch import Tensor

__all__ = [
    "SCALINGS",
    "inverse_frequencies",
    "rotary_dim",
    "yarn_attention_factor",
    "yarn_mscale",
]

SCALINGS: Final = ("none", "linear", "llama3", "yarn")


def inverse_frequencies(
    theta: float,
    dim: int,
    *,
    scaling: str = "none",
    factor: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_context_length: int = 8192,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> Tensor:
    """`1 / theta^(2k/dim)` for k = 0 … dim/2-1, in float32, rescaled by `scaling`.

    linear: every frequency divided by `factor`. llama3: a frequency whose wavelength `2π/f`
    exceeds `original_context_length / low_freq_factor` is divided by `factor`; one whose
    wavelength is below `original_context_length / high_freq_factor` is kept; in between it
    is blended, `(1 - s) · f / factor + s · f` with
    `s = (original_context_length / wavelength - low_freq_factor) / (high_freq_factor -
    low_freq_factor)`. yarn: pair k's frequency is `f / factor` below dimension `low`, `f` above
    `high`, and blended linearly in between, `low`/`high` the dimensions that turn `beta_fast`/
    `beta_slow` times over `original_context_length` (rounded outwards when `truncate`). The
    operations are Hugging Face's, in their order, for the same float32 numbers.
    """
    k = torch.arange(0, dim, 2, dtype=torch.float32)  # 2k
    if scaling == "yarn":
        return _yarn(theta, dim, k, factor, original_context_length, beta_fast, beta_slow, truncate)
    inv_freq = 1.0 / (theta ** (k / dim))  # (dim/2,)
    if scaling == "linear":
        return inv_freq / factor
    if scaling != "llama3":
        return inv_freq
    low_freq_wavelen = original_context_length / low_freq_factor
    high_freq_wavelen = original_context_length / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_context_length / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    theta: float,
    dim: int,
    k: Tensor,
    factor: float,
    original: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> Tensor:
    def turns_at(rotations: float) -> float:  # the dimension turning `rotations` times
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = turns_at(beta_fast), turns_at(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # 1: extrapolated (kept), 0: interpolated (divided by factor)
    pos_freqs = theta ** (k / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - kept) + (1.0 / pos_freqs) * kept


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's `0.1 · mscale · ln(factor) + 1` (1 for factor ≤ 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(
    factor: float, attention_factor: float = 0.0, mscale: float = 0.0, mscale_all_dim: float = 0.0
) -> float:
    """The factor YaRN multiplies cos and sin by: `attention_factor` when given (not 0), else
    `yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)` when both are given
    (DeepSeek), else `yarn_mscale(factor)`; as Hugging Face derives it."""
    if attention_factor:
        return attention_factor
    if mscale and mscale_all_dim:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
    return yarn_mscale(factor)


def rotary_dim(head_dim: int, fraction: float) -> int:
    """The rotated width: `int(head_dim · fraction)`, truncated as Hugging Face does."""
    return int(head_dim * fraction)
