"""The key/value cache of incremental decoding, preallocated for the whole context.

`KVCache` holds every layer's keys and values for `batch` sequences, two tensors of shape
`(B, Hkv, context_length, D)` per layer, allocated once on the model's device and dtype. Each
forward writes its new keys and values into the next slots in place (no reallocation per token,
so the storage never moves under `torch.compile`) and hands the attention kernel the filled
prefix, `Sq` new queries against `Sk = filled + Sq` keys: the kernel contract's causal
alignment to the end does the rest. Keys are cached after the positional rotation, so RoPE
rotates only the new q and k.

Left-padded batches (prompts of different lengths) mark their pad slots once with `pad`: pad
keys are masked out of every later query through the kernel's `mask` contract, and each row's
positions count its real tokens only, so a padded prompt is encoded as it would be alone.

`KVCache.for_model` reads a model through `SizedModel` (its spec and its weights' device and
dtype), so the cache depends on no model class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lmcore.errors import ModelInputError

if TYPE_CHECKING:
    from lmcore.spec import ModelSpec


class HasWeight(Protocol):
    @property
    def weight(self) -> Tensor: ...


class SizedModel(Protocol):
    """What a KV cache is sized from: the model's spec (layers, kv heads, head width, context)
    and its `lm_head`, whose weight has the model's device and dtype."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def lm_head(self) -> HasWeight: ...


@dataclass
class LayerCache:
    """One layer's view of a `KVCache` for one forward: `start` slots are filled."""

    k: Float[Tensor, "B Hkv C D"]
    v: Float[Tensor, "B Hkv C D"]
    start: int

    def update(
        self, k: Float[Tensor, "B Hkv T D"], v: Float[Tensor, "B Hkv T D"]
    ) -> tuple[Float[Tensor, "B Hkv Sk D"], Float[Tensor, "B Hkv Sk D"]]:
        """Write the new keys and values into their slots; return all of them so far."""
        end = self.start + k.shape[2]
        self.k[:, :, self.start : end] = k  # in place: the storage never moves
        self.v[:, :, self.start : end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


class KVCache:
    """Keys, values and positions of `batch` sequences, for every layer of a model.

    Build it with `KVCache.for_model(model, batch)` and pass it to `model(ids, cache=cache)`:
    each call appends its tokens (positions continue from the filled slots unless given).
    `length` is the number of filled slots (pads included); `reset()` empties it for reuse.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        shape = (batch, num_kv_heads, context_length, head_dim)
        # One tensor per layer (not one for all): under torch.compile a write into a view of a
        # shared tensor is replayed as a copy of the whole tensor, one per layer and step.
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        # Absolute position of each slot's token: the keys' positions for attention biases.
        self.positions = torch.zeros(batch, context_length, dtype=torch.long, device=device)
        self.valid: Bool[Tensor, "B C"] | None = None  # None: no pads
        self.pads: Int[Tensor, "B 1"] | None = None  # pad slots at the start of each row
        self.batch, self.context_length = batch, context_length
        self.length = 0

    @classmethod
    def for_model(cls, model: SizedModel, batch: int) -> KVCache:
        """An empty cache for `batch` sequences of `model`, on its device and in its dtype,
        for its whole context_length."""
        spec, weight = model.spec, model.lm_head.weight
        return cls(
            num_layers=spec.num_layers,
            batch=batch,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            context_length=spec.context_length,
            device=weight.device,
            dtype=weight.dtype,
        )

    def reset(self) -> None:
        """Forget every slot (the storage is kept for the next sequences)."""
        self.length, self.valid, self.pads = 0, None, None

    def truncate(self, length: int) -> None:
        """Keep the first `length` filled slots only (a chat's turn re-encoded differently from
        the tokens generated: the common prefix stays cached)."""
        if not 0 <= length <= self.length:
            raise ModelInputError(f"truncate({length}): the cache holds {self.length} tokens")
        self.length = length

    def pad(self, real: Bool[Tensor, "B T"]) -> None:
        """Mark the first `T` slots of an empty cache: False where a row is left padding.
        Call before the prompt's forward."""
        if self.length:
            raise ModelInputError(
                f"pad() marks the slots of a prompt before its forward, but the cache already "
                f"holds {self.length} tokens; call cache.reset() first"
            )
        batch, seq = real.shape
        if batch != self.batch or seq > self.context_length:
            raise ModelInputError(
                f"pad() got a mask of shape {tuple(real.shape)} for a cache of batch "
                f"{self.batch} and context_length={self.context_length}"
            )
        real = real.to(self.positions.device, torch.bool)
        self.valid = torch.ones(
            self.batch, self.context_length, dtype=torch.bool, device=real.device
        )
        self.valid[:, :seq] = real
        self.pads = (~real).sum(dim=1, keepdim=True)  # (B, 1): left padding is a prefix

    def check_room(self, new: int) -> None:
        """Raise when `new` more tokens would not fit in context_length."""
        if self.length + new > self.context_length:
            raise ModelInputError(
                f"the KV cache holds {self.length} tokens; {new} more make "
                f"{self.length + new}, beyond context_length={self.context_length}; "
                "start a new sequence (cache.reset()) or build with a larger context_length"
            )

    def next_positions(self, seq: int) -> Int[Tensor, "B_or_1 T"]:
        """The positions of the next `seq` tokens: counting each row's real tokens only."""
        slots = torch.arange(self.length, self.length + seq, device=self.positions.device)
        if self.pads is None:
            return slots[None, :]  # (1, T)
        return (slots[None, :] - self.pads).clamp_min(0)  # (B, T); pads sit at position 0

    def layer(self, i: int) -> LayerCache:
        return LayerCache(self.k[i], self.v[i], self.length)

    def record(self, positions: Int[Tensor, "B_or_1 T"]) -> None:
        """Store the positions of the tokens being appended (before the layers run)."""
        self.positions[:, self.length : self.length + positions.shape[-1]] = positions

    def key_positions(self, seq: int) -> Int[Tensor, "B Sk"]:
        """The positions of every key once `seq` tokens are appended."""
        return self.positions[:, : self.length + seq]

    def mask(self, seq: int) -> Bool[Tensor, "B 1 T Sk"] | None:
        """For a padded cache, which keys each of `seq` new queries may see (True = may
        attend; the kernel adds causality): the real ones, and itself for a pad query, so that
        no row is masked entirely (a kernel may give NaN there, and 0·NaN reaches real rows
        through the pad's value). None when nothing is padded."""
        if self.valid is None:
            return None
        end = self.length + seq
        keys = torch.arange(end, device=self.valid.device)  # slot of each key
        queries = torch.arange(self.length, end, device=self.valid.device)[:, None]
        itself = keys[None, :] == queries  # (T, Sk)
        return self.valid[:, None, None, :end] | itself  # (B, 1, T, Sk)

    def advance(self, seq: int) -> None:
        self.length += seq

    def select(self, rows: Int[Tensor, " N"]) -> KVCache:
        """A new cache of `len(rows)` sequences, row `i` a copy of this cache's row `rows[i]`:
        a prefix computed once continues in several ways (scoring the choices of a question)."""
        new = KVCache.__new__(KVCache)
        rows = rows.to(self.positions.device)
        new.k = [k.index_select(0, rows) for k in self.k]
        new.v = [v.index_select(0, rows) for v in self.v]
        new.positions = self.positions.index_select(0, rows)
        new.valid = None if self.valid is None else self.valid.index_select(0, rows)
        new.pads = None if self.pads is None else self.pads.index_select(0, rows)
        new.batch, new.context_length, new.length = len(rows), self.context_length, self.length
        return new
