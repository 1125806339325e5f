"""The component contracts. A component's factory returns an `nn.Module` that fits one of
them: norm, ffn, pos, attn (the attention kernel), block (the wiring of one layer), mixer
(the sub-layer that mixes tokens: attention, or a recurrent or convolutional one) and adapter
(a trainable update of one matrix of a built model).

Shapes: B batch, T / S sequence, H query heads, Hkv key/value heads, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

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

    The scores are `s = scale · q kᵀ` (`scale` 1 / sqrt(D) unless given), then
    `softcap · tanh(s / softcap)` when `softcap` is given, then `+ bias`; with `window` a
    query at position p sees only the keys at positions p - window + 1 .. p (and, causal,
    none after it). The model passes `scale`, `softcap` and `window` only when the spec sets
    them, and only to a kernel declaring the feature of that name (a kernel without "scale"
    gets q multiplied instead; one without "softcap" or "window" is refused at spec time).
    With "documents", a document-masked forward passes `documents=`, the keys' document ids
    `(B, Sk)` int64, non-decreasing per row: a query attends only to keys of its own document
    (block-causal with `causal`); a kernel without it is refused by name.
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


class LayerContext(NamedTuple):
    """What one forward hands each layer for its token mixer, besides the layer's input: the
    positional rotation and bias, the padding mask, the layer's decoding cache, the new
    tokens' positions and, for packed rows, their document ids. A block passes it to its mixer unchanged: `self.attn(h, context)`."""

    rotation: Rotation | None = None
    bias: Tensor | None = None
    mask: Tensor | None = None
    cache: Any = None  # the layer's `lmcore.model.cache.LayerCache`, or None
    positions: Tensor | None = None  # (B or 1, T): the new tokens' positions
    # (B, T) int64 document ids, non-decreasing per row, or None (one stream): a mixer with
    # the 'documents' feature lets no information cross a boundary; the positions then
    # restart at 0 at each document's first token.
    documents: Tensor | None = None


@runtime_checkable
class AttentionLayer(Protocol):
    """What a block gets as `attn`: projections, positional rotation, the kernel and the KV
    cache together; maps `(B, T, d_model)` to `(B, T, d_model)`, mixing tokens causally."""

    def __call__(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]: ...


@runtime_checkable
class Mixer(Protocol):
    """The token-mixing sub-layer of a layer (what a block holds as `attn`): maps
    `(B, T, d_model)` to the same shape and dtype, causally (no output depends on a later
    token).

    Decoding: a mixer that can decode with a cache (it does not declare "nocache") also has
    `decoding_state(*, batch, context_length, device, dtype)`, returning its state for `batch`
    sequences, allocated once (a `lmcore.model.cache.DecodingState`: keys and values, a latent,
    a recurrent state and a convolution's tail). Each cached forward gets it as
    `context.cache.state` with `context.cache.start`, the tokens it holds already (0: fresh,
    whatever the tensors hold), and `context.cache.valid`, False where a new token is left
    padding; the forward leaves in it the state after its tokens, written in place.
    """

    def __call__(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]: ...


@runtime_checkable
class DecodingState(Protocol):
    """One layer's decoding state for a batch of sequences (`Mixer.decoding_state`).

    `rewind`: whether the state can go back to an earlier token (keys and values can: the
    slots after it are forgotten; a recurrent state cannot). `select(rows)`: a new state of
    `len(rows)` sequences, row i a copy of row `rows[i]`. `tensors()`: every tensor it holds,
    by name, batch first (what its bytes are counted from)."""

    rewind: bool

    def select(self, rows: Int[Tensor, " N"]) -> DecodingState: ...

    def tensors(self) -> dict[str, Tensor]: ...


@runtime_checkable
class Block(Protocol):
    """One layer's wiring of the residual stream: maps `(B, T, d_model)` to the same shape and
    dtype.

    Its factory gets `attn` (the layer's `Mixer`: lmcore's attention or another), `ffn` (a `FeedForward`) and `norm`, a
    function that builds one more norm of the model's kind each call; the block keeps them as
    attributes `attn`, `ffn` and the names its `norms` declaration lists (so the state-dict
    keys are `attn.*`, `ffn.*` and `<name>.*`, plus its own parameters), calls
    `self.attn(h, context)` with the `context` it is given, and mixes tokens through `attn`
    only. With the "residual" feature, it returns its input unchanged when both sub-layers
    return zeros.
    """

    def __call__(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]: ...


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


@runtime_checkable
class Adapter(Protocol):
    """Built for one targeted matrix W (`in_features`, `out_features`, `splits`: the rows of
    each logical matrix a packed W holds); `x ↦ ΔW x`, `(..., in_features)` to
    `(..., out_features)`, added to W's output (`lmcore.model.adapters`). `delta()` is the
    update as a matrix, `(out_features, in_features)`, which merging adds to W: the output must
    equal `x @ delta().T`. Zero at initialisation, so the model's logits do not change."""

    def __call__(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]: ...

    def delta(self) -> Float[Tensor, "d_out d_in"]: ...


@runtime_checkable
class QuantizedMatrix(Protocol):
    """One matrix W (`out_features`, `in_features`) stored in a weight format
    (`lmcore.model.quant`): `x ↦ x @ Wᵀ` from the stored form, `dequantize()` gives W in
    float32, `quantize_(w)` stores a float matrix (rounding as the format does) and `rows(ids)`
    gives W's rows `ids` in float32 (an embedding's lookup). Its tensors are parameters that
    need no gradient, stored in a checkpoint as they are held."""

    def __call__(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]: ...

    def dequantize(self) -> Float[Tensor, "d_out d_in"]: ...

    def quantize_(self, w: Float[Tensor, "d_out d_in"]) -> None: ...

    def rows(self, ids: Tensor) -> Float[Tensor, "... d_in"]: ...


PROTOCOLS: dict[str, type] = {
    "norm": Norm,
    "ffn": FeedForward,
    "pos": PositionalEncoding,
    "attn": AttentionKernel,
    "block": Block,
    "mixer": Mixer,
    "adapter": Adapter,
    "quant": QuantizedMatrix,
}
