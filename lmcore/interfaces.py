"""The four component contracts. A component's factory returns an `nn.Module` that fits one of them.

Shapes: B batch, T / S sequence, H query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

Rotation = Callable[[Float[Tensor, "B H S D"]], Float[Tensor, "B H S D"]]


@runtime_checkable
class Norm(Protocol):
    """Built for `d_model`; maps `(..., d_model)` to the same shape and dtype."""

    def __call__(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]: ...


@runtime_checkable
class FeedForward(Protocol):
    """Built for `d_model` and `d_ff`; maps `(..., d_model)` to the same shape and dtype."""

    def __call__(self, x: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_model"]: ...


@runtime_checkable
class AttentionKernel(Protocol):
    """Exact or approximate attention over heads that are already projected.

    `q: (B, H, Sq, D)`, `k, v: (B, Hkv, Sk, D)` with H a multiple of Hkv. `causal` aligns the
    queries to the end of the keys (query i sits at position Sk - Sq + i). `mask` is boolean,
    True = may attend, broadcastable to `(B, H, Sq, Sk)`; `bias` is added to the scores and
    broadcastable likewise. A kernel without the "gqa" feature is handed k, v with H heads.
    """

    def __call__(
        self,
        q: Float[Tensor, "B H Sq D"],
        k: Float[Tensor, "B Hkv Sk D"],
        v: Float[Tensor, "B Hkv Sk D"],
        *,
        causal: bool,
        mask: Bool[Tensor, "... Sq Sk"] | None = None,
        bias: Float[Tensor, "... Sq Sk"] | None = None,
    ) -> Float[Tensor, "B H Sq D"]: ...


@runtime_checkable
class PositionalEncoding(Protocol):
    """One instance per model, used once per forward pass. Each hook may do nothing.

    - `embed`: add to the token embeddings (absolute encodings);
    - `rotation`: return a function that rotates q and k (RoPE), or None;
    - `attention_bias`: return an additive bias `(H, Sq, Sk)` or `(B, H, Sq, Sk)` (ALiBi), or None.
    """

    def embed(
        self, x: Float[Tensor, "B T d_model"], token_positions: Int[Tensor, "B T"]
    ) -> Float[Tensor, "B T d_model"]: ...

    def rotation(self, token_positions: Int[Tensor, "B T"]) -> Rotation | None: ...

    def attention_bias(
        self, q_positions: Int[Tensor, "B Sq"], k_positions: Int[Tensor, "B Sk"]
    ) -> Float[Tensor, "... H Sq Sk"] | None: ...


class PositionalEncodingBase(nn.Module):
    """A `PositionalEncoding` whose three hooks do nothing; override the ones you need."""

    def embed(
        self, x: Float[Tensor, "B T d_model"], token_positions: Int[Tensor, "B T"]
    ) -> Float[Tensor, "B T d_model"]:
        return x

    def rotation(self, token_positions: Int[Tensor, "B T"]) -> Rotation | None:
        return None

    def attention_bias(
        self, q_positions: Int[Tensor, "B Sq"], k_positions: Int[Tensor, "B Sk"]
    ) -> Float[Tensor, "... H Sq Sk"] | None:
        return None


PROTOCOLS: dict[str, type] = {
    "norm": Norm,
    "ffn": FeedForward,
    "pos": PositionalEncoding,
    "attn": AttentionKernel,
}
