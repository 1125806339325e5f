"""The decoding cache of incremental decoding: each layer's state, as its mixer declares it,
sized to the tokens asked for and grown in chunks when more follow.

`DecodingCache` (also `KVCache`, its first name) holds one state per layer for `batch`
sequences, made once by the layer's mixer (`Mixer.decoding_state`) on the model's device and in
its dtype: the keys and values of attention (`KVState`, two `(B, Hkv, context_length, D)`
tensors), a latent per token (`ContextState`, latent attention), or a recurrent state and a
convolution's tail whose size does not grow with the context (`RecurrentState`). Each forward
writes its tokens' state in place (no reallocation per token, so the storage never moves under
`torch.compile` while the cache has room).

Capacity: a cache holds `capacity` slots, at most the model's `context_length`. `generate`
reserves what a request needs (prompt + new tokens - 1: the last token sampled is never fed
back) before its first step, rounded up to a multiple of `chunk` (64 slots: a compiled step
sees the same shapes across requests of similar length); a cache that must take more (a chat's
next turn, a forward beyond its room) grows to at least twice its capacity, capped at the
context, so n tokens fed one at a time reallocate O(log n) times. Growing makes each layer's state afresh from its mixer and copies
the filled slots across; the slots beyond are zeros (never read, since attention sees the
filled prefix only, but a state is then a function of the tokens fed alone). Attention hands its kernel the filled prefix, `Sq` new queries against
`Sk = filled + Sq` keys; keys are cached after the positional rotation, so RoPE rotates only
the new q and k.

What a cache can do with its states: `select` rows (any state), `truncate` to an earlier token
(only where every state can go back: keys and values can, a recurrent state cannot, and the
cache refuses it by name), `pad` a batch of left-padded prompts (pad keys are masked out of
every later query through the kernel's `mask` contract; a recurrent mixer leaves its state as
it was for a pad token, told by `LayerCache.valid`; each row's positions count its real tokens
only), so a padded prompt is encoded as it would be alone.

`DecodingCache.for_model` reads a model through `SizedModel` (its spec, where its weights are,
and its layers' states), so the cache depends on no model class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lmcore.errors import ModelInputError

if TYPE_CHECKING:
    from lmcore.interfaces import DecodingState
    from lmcore.spec import ModelSpec


class HasWeight(Protocol):
    @property
    def weight(self) -> Tensor: ...


class SizedModel(Protocol):
    """What a decoding cache is sized from: the model's spec (layers, context), its `lm_head`,
    whose weight has the model's device and dtype, and `decoding_states(batch, slots)`, each
    layer's state for `slots` positions (what its mixer declares) with the name of the mixer
    that made it."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def lm_head(self) -> HasWeight: ...

    def decoding_states(
        self, batch: int, slots: int | None = None
    ) -> Sequence[tuple[str, DecodingState]]: ...


# (batch, slots) -> every layer's state afresh
StateMaker = Callable[[int, int], Sequence["DecodingState"]]
CHUNK = 64  # slots: a cache's capacity is a multiple of it (or the whole context)


# ------------------------------------------------------------------------------ states


@dataclass(eq=False)
class TensorState:
    """A layer's decoding state: named tensors, batch first. `rewind` (see
    `lmcore.interfaces.DecodingState`) is the class's: `ContextState` can go back to an
    earlier token, `RecurrentState` cannot."""

    values: dict[str, Tensor]
    rewind: ClassVar[bool] = False

    def __getitem__(self, name: str) -> Tensor:
        return self.values[name]

    def select(self, rows: Int[Tensor, " N"]) -> TensorState:
        return type(self)({k: t.index_select(0, rows) for k, t in self.values.items()})

    def tensors(self) -> dict[str, Tensor]:
        return dict(self.values)


class RecurrentState(TensorState):
    """A state of a fixed size per sequence, overwritten by each forward (a recurrent matrix,
    a convolution's last inputs): it holds the sequence so far in its values, so it cannot be
    taken back to an earlier token."""

    rewind: ClassVar[bool] = False


class ContextState(TensorState):
    """Tensors with a slot per position of the context (a latent per token): the forward
    writes its tokens' slots; the slots after a shorter length are simply forgotten."""

    rewind: ClassVar[bool] = True


class KVState(ContextState):
    """Attention's keys and values, `(B, Hkv, context_length, D)` each."""

    @classmethod
    def empty(
        cls,
        *,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVState:
        shape = (batch, num_kv_heads, context_length, head_dim)
        # One tensor each per layer (not one for all): under torch.compile a write into a
        # view of a shared tensor is replayed as a copy of the whole tensor, per layer and step.
        # Zero-filled, though a slot is read only once a forward has written it: the state is
        # then the same however the tokens came (the kit compares prefill with one at a time),
        # and sized to the request, the fill costs next to nothing.
        return cls(
            {
                "k": torch.zeros(shape, device=device, dtype=dtype),
                "v": torch.zeros(shape, device=device, dtype=dtype),
            }
        )

    @property
    def k(self) -> Float[Tensor, "B Hkv C D"]:
        return self.values["k"]

    @property
    def v(self) -> Float[Tensor, "B Hkv C D"]:
        return self.values["v"]

    def update(
        self, k: Float[Tensor, "B Hkv T D"], v: Float[Tensor, "B Hkv T D"], start: int
    ) -> tuple[Float[Tensor, "B Hkv Sk D"], Float[Tensor, "B Hkv Sk D"]]:
        """Write the new keys and values into slots `start..`; return all of them so far."""
        end = start + k.shape[2]
        self.k[:, :, start:end] = k  # in place: the storage never moves
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


@dataclass(eq=False)
class CompoundState:
    """The states of a mixer made of several (Falcon-H1's attention and Mamba-2 side by side):
    one per named part, each as that part makes it. It goes back to an earlier token when
    every part can."""

    parts: dict[str, DecodingState]

    @property
    def rewind(self) -> bool:
        return all(p.rewind for p in self.parts.values())

    def __getitem__(self, name: str) -> DecodingState:
        return self.parts[name]

    def select(self, rows: Int[Tensor, " N"]) -> CompoundState:
        return CompoundState({k: p.select(rows) for k, p in self.parts.items()})

    def tensors(self) -> dict[str, Tensor]:
        return {f"{k}.{n}": t for k, p in self.parts.items() for n, t in p.tensors().items()}


@dataclass
class LayerCache:
    """One layer's view of a `DecodingCache` for one forward: its `state`, the `start` tokens
    it holds already (0: fresh; its tensors may hold an earlier sequence's values) and, for a
    padded batch, `valid`, False where a new token is left padding."""

    state: Any
    start: int
    valid: Bool[Tensor, "B T"] | None = None

    def update(
        self, k: Float[Tensor, "B Hkv T D"], v: Float[Tensor, "B Hkv T D"]
    ) -> tuple[Float[Tensor, "B Hkv Sk D"], Float[Tensor, "B Hkv Sk D"]]:
        """Attention's: write the new keys and values; return all of them so far."""
        keys_values: KVState = self.state
        return keys_values.update(k, v, self.start)

    def part(self, name: str) -> LayerCache:
        """The view of one part of a `CompoundState`, for the sub-layer that made it."""
        compound: CompoundState = self.state
        return LayerCache(compound[name], self.start, self.valid)


# ------------------------------------------------------------------------------ the cache


class DecodingCache:
    """Every layer's decoding state and the positions of `batch` sequences.

    Build it with `DecodingCache.for_model(model, batch, capacity)` and pass it to
    `model(ids, cache=cache)`: each call appends its tokens (positions continue from the filled
    slots unless given). `length` is the number of tokens fed (pads included); `capacity` the
    slots held (grown by `reserve`, never beyond `context_length`); `reset()` empties it for
    reuse. `states[i]` is layer i's state, `names[i]` the mixer that made it.
    """

    def __init__(
        self,
        states: Sequence[DecodingState],
        *,
        batch: int,
        context_length: int,
        names: Sequence[str] | None = None,
        device: torch.device | str | None = None,
        capacity: int | None = None,
        make: StateMaker | None = None,
        chunk: int = CHUNK,
    ):
        """`states` hold `capacity` slots each (default: `context_length`); `make(batch,
        slots)` makes every layer's state afresh for `slots` positions, for `reserve` to grow
        into (None: the cache cannot grow)."""
        self.states = list(states)
        self.names = list(names) if names is not None else ["?"] * len(self.states)
        self.capacity = context_length if capacity is None else capacity
        # Absolute position of each slot's token: the keys' positions for attention biases.
        self.positions = torch.zeros(batch, self.capacity, dtype=torch.long, device=device)
        self.valid: Bool[Tensor, "B C"] | None = None  # None: no pads
        self.pads: Int[Tensor, "B 1"] | None = None  # pad slots at the start of each row
        self.batch, self.context_length = batch, context_length
        self.length = 0
        self.make, self.chunk = make, chunk
        self.grown = 0  # reallocations so far (a test counts them)

    @classmethod
    def for_model(
        cls, model: SizedModel, batch: int, capacity: int | None = None, *, chunk: int = CHUNK
    ) -> DecodingCache:
        """An empty cache for `batch` sequences of `model`, on its device and in its dtype,
        holding `capacity` slots (default 0: nothing is allocated until a forward or `reserve`
        asks for room), at most the model's context_length; it grows in multiples of `chunk`
        slots."""
        context = model.spec.context_length
        slots = 0 if capacity is None else capacity
        if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= context:
            raise ModelInputError(
                f"capacity={capacity!r}: a cache holds 0..{context} slots "
                f"(context_length={context})"
            )
        named = model.decoding_states(batch, slots)

        def make(rows: int, slots: int) -> list[DecodingState]:
            return [state for _, state in model.decoding_states(rows, slots)]

        return cls(
            [state for _, state in named],
            batch=batch,
            context_length=context,
            names=[name for name, _ in named],
            device=model.lm_head.weight.device,
            capacity=slots,
            make=make,
            chunk=chunk,
        )

    def reserve(self, total: int) -> None:
        """Room for `total` tokens in all (those held included): when the capacity is less,
        grow to `max(total, 2 × capacity)` rounded up to a multiple of `chunk`, capped at
        context_length (amortised: a sequence fed one token at a time reallocates O(log n)
        times), copying the filled slots."""
        if total <= self.capacity:
            return
        if total > self.context_length:
            self.check_room(total - self.length)  # raises, naming the numbers
        if self.make is None:
            raise ModelInputError(
                f"the KV cache holds {self.capacity} slots and cannot grow to {total}: it was "
                "built from states alone; build it with DecodingCache.for_model(model, batch, "
                "capacity)"
            )
        wanted = max(total, 2 * self.capacity)
        slots = min(self.context_length, -(-wanted // self.chunk) * self.chunk)
        fresh = list(self.make(self.batch, slots))
        for old, new in zip(self.states, fresh, strict=True):
            _copy_filled(old.tensors(), new.tensors(), self.length)
        self.states = fresh
        self.positions = _grown(self.positions, slots, self.length)
        if self.valid is not None:
            self.valid = _grown(self.valid, slots, self.length, fill=True)
        self.capacity = slots
        self.grown += 1

    @property
    def k(self) -> list[Tensor]:
        """The keys of each attention layer (the layers whose state is a `KVState`)."""
        return [s.k for s in self.states if isinstance(s, KVState)]

    @property
    def v(self) -> list[Tensor]:
        return [s.v for s in self.states if isinstance(s, KVState)]

    def nbytes(self) -> int:
        """Bytes the states and positions hold."""
        held = sum(t.nbytes for s in self.states for t in s.tensors().values())
        return held + self.positions.nbytes

    def reset(self) -> None:
        """Forget every token (the storage is kept for the next sequences)."""
        self.length, self.valid, self.pads = 0, None, None

    def can_truncate(self, length: int) -> bool:
        """Whether `truncate(length)` would work: `length` within what the cache holds, and
        either nothing to take back (its length, or 0) or every state can go back."""
        if not 0 <= length <= self.length:
            return False
        return length in (0, self.length) or all(s.rewind for s in self.states)

    def truncate(self, length: int) -> None:
        """Keep the first `length` tokens only (a chat's turn re-encoded differently from the
        tokens generated: the common prefix stays cached). A layer whose state cannot go back
        to an earlier token (a recurrent state) refuses any length but 0 and its own."""
        if not 0 <= length <= self.length:
            raise ModelInputError(f"truncate({length}): the cache holds {self.length} tokens")
        if length not in (0, self.length):
            for i, state in enumerate(self.states):
                if not state.rewind:
                    raise ModelInputError(
                        f"truncate({length}): layer {i}'s mixer {self.names[i]!r} keeps a "
                        f"state of fixed size that holds all {self.length} tokens and cannot go "
                        "back to an earlier one; truncate(0) (or reset()) and feed the tokens "
                        "to keep again"
                    )
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
        self.reserve(seq)
        real = real.to(self.positions.device, torch.bool)
        self.valid = torch.ones(self.batch, self.capacity, dtype=torch.bool, device=real.device)
        self.valid[:, :seq] = real
        self.pads = (~real).sum(dim=1, keepdim=True)  # (B, 1): left padding is a prefix

    def check_room(self, new: int) -> None:
        """Raise when `new` more tokens would not fit in context_length; grow the cache when
        they fit the context but not its capacity."""
        if self.length + new > self.context_length:
            raise ModelInputError(
                f"the KV cache holds {self.length} tokens; {new} more make "
                f"{self.length + new}, beyond context_length={self.context_length}; "
                "start a new sequence (cache.reset()) or build with a larger context_length"
            )
        self.reserve(self.length + new)

    def next_positions(self, seq: int) -> Int[Tensor, "B_or_1 T"]:
        """The positions of the next `seq` tokens: counting each row's real tokens only."""
        slots = torch.arange(self.length, self.length + seq, device=self.positions.device)
        if self.pads is None:
            return slots[None, :]  # (1, T)
        return (slots[None, :] - self.pads).clamp_min(0)  # (B, T); pads sit at position 0

    def layers(self, seq: int) -> list[LayerCache]:
        """Each layer's view for a forward of `seq` new tokens."""
        valid = None if self.valid is None else self.valid[:, self.length : self.length + seq]
        return [LayerCache(state, self.length, valid) for state in self.states]

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

    def select(self, rows: Int[Tensor, " N"]) -> DecodingCache:
        """A new cache of `len(rows)` sequences, row `i` a copy of this cache's row `rows[i]`:
        a prefix computed once continues in several ways (scoring the choices of a question)."""
        new = DecodingCache.__new__(DecodingCache)
        rows = rows.to(self.positions.device)
        new.states = [s.select(rows) for s in self.states]
        new.names = list(self.names)
        new.positions = self.positions.index_select(0, rows)
        new.valid = None if self.valid is None else self.valid.index_select(0, rows)
        new.pads = None if self.pads is None else self.pads.index_select(0, rows)
        new.batch, new.context_length, new.length = len(rows), self.context_length, self.length
        new.capacity, new.make, new.chunk, new.grown = self.capacity, self.make, self.chunk, 0
        return new


def _copy_filled(old: dict[str, Tensor], new: dict[str, Tensor], length: int) -> None:
    """Copy a state's held values into its grown twin: a tensor of the same shape (a
    recurrent state) whole, one with more slots its first `length` along the dimension that
    grew."""
    for name, before in old.items():
        after = new[name]
        grew = [d for d, (a, b) in enumerate(zip(before.shape, after.shape, strict=True)) if a != b]
        if not grew:
            after.copy_(before)
        else:  # a state holds one dimension of slots
            after.narrow(grew[0], 0, length).copy_(before.narrow(grew[0], 0, length))


def _grown(t: Tensor, slots: int, length: int, fill: bool | None = None) -> Tensor:
    """`(B, slots)` holding `t`'s first `length` columns (the rest `fill`, or zeros)."""
    out = t.new_zeros(t.shape[0], slots) if fill is None else t.new_full((t.shape[0], slots), fill)
    out[:, :length] = t[:, :length]
    return out


KVCache = DecodingCache  # its name while every layer's state was keys and values

