"""Text generation: greedy decoding, temperature, top-k and nucleus (top-p) sampling, a stop
token, with a decoding cache that goes through the component contracts.

    ids = model.generate(prompt, 64, Sampling(temperature=0.8, top_p=0.95, seed=0))  # (new,)
    for tok in model.stream(prompt, 64, GREEDY): ...                     # one step at a time

How each token is picked is one `Sampling` value; what is not sampling (stop tokens, the cache,
a cache to continue) are keywords. Each step runs the model on the new token only (`KVCache`,
each layer's state as its mixer declares it): an attention kernel gets one query against every
cached key, a recurrent mixer its state, the positional encoding the absolute position of the
new token. Every check (options, the components' capabilities, the
prompt's ids, room in the context) runs once before the first step; the steps feed back ids
sampled from the model's own vocabulary, so no step validates ids or synchronises with the
device, except to see whether every sequence has reached `stop_token`.

The loop reads a model through `DecodingModel` (its spec, blueprint, weights' device and
unchecked forward), never through `TransformerLM`; `compile_decoding` returns a `Decoder`, the
model with a compiled step, and leaves the model as it was.

Prompts: a 1-d tensor (one prompt: 1-d results), a 2-d tensor (a batch of equal lengths), or a
list of 1-d tensors / lists of ints, which may differ in length: they are left-padded, and the
pads are masked out through the attention kernel's `mask` contract, and a recurrent mixer leaves
its state as it was for them (a kernel or mixer without 'mask' can only take equal lengths).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lmcore.errors import GenerationError, ModelInputError, one_of
from lmcore.model.cache import HasWeight, KVCache, SizedModel
from lmcore.model.inputs import check_ids
from lmcore.model.nn import join_products, softmax

if TYPE_CHECKING:
    from lmcore.blueprint import Blueprint
    from lmcore.interfaces import DecodingState
    from lmcore.spec import ModelSpec

NOCACHE = "nocache"  # the feature a component declares when it cannot work with a KV cache

Prompt = Tensor | Sequence[int] | Sequence[Tensor | Sequence[int]]
# One forward without input checks: (ids (B, T), positions (B or 1, T), cache) -> logits.
Step = Callable[..., Tensor]  # (ids, positions, cache, *, last) -> logits


class DecodingModel(SizedModel, Protocol):
    """What decoding reads from a model: its spec and where its weights are (`SizedModel`, what
    a KV cache is sized from), its blueprint (the components' features) and the forward that
    each step runs. `TransformerLM` is one; so is a `Decoder`."""

    @property
    def blueprint(self) -> Blueprint: ...

    def forward_unchecked(
        self, ids: Tensor, positions: Tensor, cache: KVCache | None = None, *, last: bool = False
    ) -> Tensor: ...


def _real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class Sampling:
    """How each next token is picked from the logits.

    temperature 0: the most likely token (greedy; ties go to the lowest id). Otherwise the
    logits are divided by `temperature`, only the `top_k` most likely tokens are kept (all when
    None), then the smallest set of the most likely tokens whose probability reaches `top_p`,
    and a token is drawn from what is left, renormalised. Equal probabilities are ranked by
    token id (lowest first), so ties at either cut are decided the same way every time. `seed`
    makes the draws reproducible (a generator of its own; None: torch's global one).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        t, p, k, seed = self.temperature, self.top_p, self.top_k, self.seed
        if not _real(t) or not (math.isfinite(t) and t >= 0):
            raise GenerationError(
                f"temperature must be a finite number >= 0, got {t!r}; 0 is greedy, 1 samples "
                "from the model's distribution"
            )
        if not _real(p) or not 0 < p <= 1:
            raise GenerationError(
                f"top_p must be in (0, 1], got {p!r}; 1 keeps every token, 0.9 the most likely "
                "tokens that make up 90% of the probability"
            )
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise GenerationError(f"top_k must be a positive integer or None, got {k!r}")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64
        ):
            raise GenerationError(f"seed must be an integer in 0 .. 2**64-1 or None, got {seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device: torch.device) -> torch.Generator | None:
        """A generator on `device` seeded with `seed`; None without a seed (torch's global
        generator) or when nothing is drawn (greedy)."""
        if self.seed is None or self.greedy:
            return None
        generator = torch.Generator(device=device)
        generator.manual_seed(self.seed)
        return generator


GREEDY = Sampling(temperature=0.0)  # the most likely token at every step
SAMPLE = Sampling()  # the default: a draw from the model's own distribution


def sample(
    logits: Float[Tensor, "B V"], sampling: Sampling, generator: torch.Generator | None = None
) -> Int[Tensor, " B"]:
    """One token per row of `logits` (see `Sampling`); computed in float32 or wider."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if sampling.greedy:
        return logits.argmax(dim=-1)  # the first maximum: the lowest id
    # Shift before scaling: the largest logit becomes 0 and the others stay finite or -inf, so a
    # temperature as small as 5e-324 cannot turn them into inf - inf = NaN.
    # Below float32's smallest normal number the division is done in float64 (where 5e-324
    # is still a number, not 0).
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    if sampling.temperature < torch.finfo(shifted.dtype).tiny:
        shifted = shifted.double()
    probs = softmax(shifted / sampling.temperature, dim=-1)
    if sampling.top_k is not None or sampling.top_p < 1:
        # One stable sort ranks tokens by probability, ties by id; both cuts are by rank.
        ranked, order = probs.sort(dim=-1, descending=True, stable=True)
        keep = torch.ones_like(ranked, dtype=torch.bool)
        if sampling.top_k is not None:
            keep[:, sampling.top_k :] = False
        if sampling.top_p < 1:
            # Keep a token while the more likely ones before it have not reached p: the
            # smallest set whose probability reaches p (the most likely token always stays).
            before = ranked.cumsum(dim=-1) - ranked
            keep &= before < sampling.top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, ranked * keep)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # renormalises


# ------------------------------------------------------------------------------ checks


def check_cache_support(model: DecodingModel) -> None:
    """Raise `GenerationError` when a component of `model` declares it cannot work with a KV
    cache (feature 'nocache'), before anything runs."""
    for _, part in model.blueprint.used():  # every component, per-layer and nested ones too
        if NOCACHE in part.component.features:
            kind, entry = part.kind, part.entry
            raise GenerationError(
                f"{kind} {entry.name!r} from {entry.provenance} declares {NOCACHE!r}: it cannot "
                "work with a KV cache; generate with cache=False (recomputes the whole sequence "
                "at every step) or use another component"
            )


def prompt_batch(
    model: SizedModel, prompt_ids: object
) -> tuple[Int[Tensor, "B T"], Bool[Tensor, "B T"] | None, bool]:
    """`(ids, real, single)`: the prompts as one `(B, T)` tensor on the model's device, left
    padded with id 0 where lengths differ (`real` False there; None when nothing is padded),
    and whether a single 1-d prompt was given. Every id is checked here, once."""
    spec, device = model.spec, model.lm_head.weight.device
    single = False
    rows: list[Tensor]
    if isinstance(prompt_ids, Tensor):
        if prompt_ids.ndim not in (1, 2):
            raise ModelInputError(
                f"prompt_ids must be 1-d (one prompt) or 2-d (a batch), got shape "
                f"{tuple(prompt_ids.shape)}; give prompts of different lengths as a list"
            )
        single = prompt_ids.ndim == 1
        _check_room(prompt_ids.shape[-1], spec.context_length)
        ids = check_ids(
            prompt_ids[None] if single else prompt_ids,
            vocab_size=spec.vocab_size,
            context_length=spec.context_length,
            device=device,
        )
        if ids.shape[0] == 0:
            raise ModelInputError("prompt_ids holds no prompt (batch of 0)")
        return ids, None, single
    if isinstance(prompt_ids, Sequence) and not isinstance(prompt_ids, str | bytes):
        if len(prompt_ids) == 0:
            raise ModelInputError("prompt_ids holds no prompt: give token ids, e.g. [1, 2, 3]")
        if all(isinstance(i, int) for i in prompt_ids):
            single, items = True, [prompt_ids]
        else:
            items = list(prompt_ids)
        rows = []
        for n, item in enumerate(items):
            # Lists of ints are made on the model's device; a tensor must already be there.
            row = item if isinstance(item, Tensor) else _as_ids(item, n).to(device)
            if row.ndim != 1:
                raise ModelInputError(
                    f"prompt {n} has shape {tuple(row.shape)}; each prompt in a list is 1-d"
                )
            _check_room(row.shape[-1] if row.ndim else 0, spec.context_length)
            check = check_ids(
                row, vocab_size=spec.vocab_size, context_length=spec.context_length, device=device
            )
            rows.append(check)
        longest = max(len(r) for r in rows)
        if all(len(r) == longest for r in rows):
            return torch.stack([r.long() for r in rows]), None, single
        ids = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
        real = torch.zeros(len(rows), longest, dtype=torch.bool, device=device)
        for b, r in enumerate(rows):  # left padding: every prompt ends at the last column
            ids[b, longest - len(r) :] = r
            real[b, longest - len(r) :] = True
        return ids, real, single
    raise ModelInputError(
        f"prompt_ids must be a tensor of token ids or a list of prompts, got "
        f"{type(prompt_ids).__name__}"
    )


def _check_room(length: int, context_length: int) -> None:
    """A prompt longer than the context: say how to shorten it so that tokens can follow."""
    if length > context_length:
        keep = max(context_length // 2, 1)
        raise GenerationError(
            f"the prompt is {length:,} tokens, more than context_length={context_length:,}; a "
            f"prompt of P tokens leaves room for {context_length + 1:,} - P new ones: shorten "
            f"it, e.g. to its last {keep:,} tokens (room for {context_length + 1 - keep:,}); "
            "lmcore never drops tokens silently"
        )


def _as_ids(item: object, n: int) -> Tensor:
    if isinstance(item, Sequence) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in item
    ):
        return torch.tensor(list(item), dtype=torch.long)
    raise ModelInputError(
        f"prompt {n} is not a list of integer token ids or a 1-d tensor: {item!r:.60}"
    )


def _check_options(
    model: DecodingModel,
    ids: Tensor,
    real: Tensor | None,
    max_new_tokens: object,
    stop_token: object,
    past: int = 0,
) -> None:
    spec, bp = model.spec, model.blueprint
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise GenerationError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    stops = stop_token if isinstance(stop_token, (list, tuple)) else [stop_token]
    if stop_token is not None and (
        not stops
        or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < spec.vocab_size
            for t in stops
        )
    ):
        raise GenerationError(
            f"stop_token must be a token id in 0..{spec.vocab_size - 1} "
            f"(vocab_size={spec.vocab_size}), a non-empty list of them, or None, got "
            f"{stop_token!r}"
        )
    # The last new token is sampled, never fed back: the model sees prompt + new - 1 tokens.
    needed = past + ids.shape[1] + max_new_tokens - 1
    if needed > spec.context_length:
        room = spec.context_length - past - ids.shape[1] + 1
        raise GenerationError(
            f"a prompt of {ids.shape[1]} tokens and max_new_tokens={max_new_tokens} need "
            f"{needed} positions{f' after the {past} cached' if past else ''}, beyond "
            f"context_length={spec.context_length}; ask for at most "
            f"{room} new tokens or shorten the prompt (lmcore never drops tokens silently)"
        )
    refused = bp.padding() if real is not None else None
    if refused is not None:
        kind, name, able = refused
        need, other = (
            ("need an attention mask", "a kernel")
            if kind == "attn"
            else ("need a mixer that leaves its state as it was for a pad", "a mixer")
        )
        raise GenerationError(
            f"prompts of different lengths are left-padded and {need}, but {kind} {name!r} "
            f"does not declare 'mask'; give prompts of equal length, generate them one at a "
            f"time, or use {other} that can: {one_of(able)}"
        )


# ------------------------------------------------------------------------------ generation


def compile_decoding(model: DecodingModel, *, regional: bool = True, **options: Any) -> Decoder:
    """`model` with its decoding step compiled by `torch.compile`: a `Decoder` whose `generate`
    and `stream` run every step through the compiled code; the model itself is left as it was
    (its own calls stay eager). `options` are passed on (``backend=...``, ``mode=...``,
    ``options={...}``, ``dynamic=...``, ``fullgraph=...``).

    `regional` (the default): each of the model's `layers` is compiled on its own, and its
    `head` (the final norm and the output matrix: in float32 on 2 cores 2.5 ms a token where
    eager takes 5-6); the step's other parts (the embedding, the positions, the cache's
    bookkeeping) stay eager. Layers of the same
    structure share one compiled code (dynamo keys it on the code and guards on the layer's
    structure, not on which layer it is), so a 30-layer model compiles about as fast as one
    layer: ~10 s on a 2-core CPU where the whole step took ~5 minutes. ``regional=False``
    compiles `model.forward_unchecked` whole, one graph per kind of call (any model with that
    method).

    Before tracing, one eager step (one token, no cache) makes whatever a component builds on
    its first call (a weight format's kernel scales, an int8 copy aligned for its kernel), so
    that the traced code finds it made and no guard changes after the first step.

    Defaults, both measured on the decode benchmark: shapes are static until they change, so
    the first prompt compiles for its length, the first one-token step compiles once for every
    fill level of the cache, and a later prompt of another length (or another batch size)
    compiles once more for all lengths (``dynamic=True`` would compile fewer graphs but turns
    every int and float into a graph input: the norms' eps become tensors, and the cache's
    sizes need guards evaluated in Python before each step, 5% slower at batch 1); and, for
    inductor without a `mode`, its C++ wrapper (``cpp_wrapper``), which calls the step's
    kernels from C++ instead of a Python function (8% faster at batch 1). The KV cache's
    storage is written in place, never reallocated."""
    if options.get("backend", "inductor") == "inductor":
        if model.lm_head.weight.device.type == "cpu":
            _check_cpp_compiler()
        if "mode" not in options:
            options["options"] = {"cpp_wrapper": True, **options.get("options", {})}
    _join(model)  # before the first step makes kernel scales, and before tracing
    _first_step(model)
    if not regional:
        return Decoder(model, torch.compile(model.forward_unchecked, **options))
    layers = getattr(model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not callable(getattr(model, "head", None)):
        raise TypeError(
            f"compile_decoding(regional=True) compiles a model's layers (`model.layers`, a "
            f"ModuleList) and its head (a method `head`); {type(model).__name__} has not "
            "both: use regional=False to compile its whole forward_unchecked"
        )
    # One compiled function that takes the layer as an argument: its call (hooks included) is
    # traced in one frame, and layers of one structure share its code.
    call = torch.compile(_call_layer, **options)
    compiled = [functools.partial(call, layer) for layer in layers]
    layered = cast(LayeredModel, model)
    head = torch.compile(layered.head, **options)
    return Decoder(model, functools.partial(layered.forward_unchecked, layers=compiled, head=head))


def _join(model: DecodingModel) -> None:
    """`join_products` on the module `model` decodes with (a `Decoder`'s own model): a
    quantized model's q, k and v, and each gated FFN's w1 and w3, one kernel call each."""
    inner = model.model if isinstance(model, Decoder) else model
    if isinstance(inner, torch.nn.Module):
        join_products(inner)


def _call_layer(layer: torch.nn.Module, x: Tensor, context: Any) -> Tensor:
    out: Tensor = layer(x, context)
    return out


class LayeredModel(DecodingModel, Protocol):
    """A model whose regions regional compilation compiles: `layers` and `head`, and a
    `forward_unchecked` that runs callables in their place (`TransformerLM`)."""

    layers: torch.nn.ModuleList

    def head(self, x: Tensor) -> Tensor: ...

    def forward_unchecked(
        self,
        ids: Tensor,
        positions: Tensor,
        cache: KVCache | None = None,
        *,
        last: bool = False,
        layers: Sequence[Callable[..., Tensor]] | None = None,
        head: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor: ...


def _check_cpp_compiler() -> None:
    """GenerationError, before anything is traced, when inductor finds no C++ compiler (its
    CPU kernels are C++): the first step would otherwise fail deep inside the compiler."""
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler as e:
        raise GenerationError(
            f"compiled decoding: torch.compile's inductor builds C++ kernels on the CPU and "
            f"finds no working C++ compiler ({' '.join(str(e).split())}); install one (g++), "
            "point CXX at it, or decode without compiling (no --compile)"
        ) from None


def _first_step(model: DecodingModel) -> None:
    """One eager forward of one token (no cache, no gradient): components that build state on
    their first call build it now, outside any trace."""
    device = model.lm_head.weight.device
    one = torch.zeros(1, 1, dtype=torch.long, device=device)
    with torch.inference_mode():
        model.forward_unchecked(one, one, None, last=True)


@dataclass(frozen=True)
class Decoder:
    """`model` decoded through `step` in place of its own `forward_unchecked` (what
    `compile_decoding` returns): `generate` and `stream` as the model's, and a `DecodingModel`
    itself, so the functions of this module and `KVCache.for_model` take it too."""

    model: DecodingModel
    step: Step

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec

    @property
    def blueprint(self) -> Blueprint:
        return self.model.blueprint

    @property
    def lm_head(self) -> HasWeight:
        return self.model.lm_head

    def decoding_states(
        self, batch: int, slots: int | None = None
    ) -> Sequence[tuple[str, DecodingState]]:
        return self.model.decoding_states(batch, slots)

    def forward_unchecked(
        self, ids: Tensor, positions: Tensor, cache: KVCache | None = None, *, last: bool = False
    ) -> Tensor:
        return self.step(ids, positions, cache, last=last)

    def generate(
        self,
        prompt_ids: Prompt,
        max_new_tokens: int,
        sampling: Sampling = SAMPLE,
        *,
        stop_token: int | Sequence[int] | None = None,
        cache: bool = True,
    ) -> Int[Tensor, "*B new"]:
        """`generate(decoder, ...)`: the new token ids after `prompt_ids`."""
        return generate(
            self, prompt_ids, max_new_tokens, sampling, stop_token=stop_token, cache=cache
        )

    def stream(
        self,
        prompt_ids: Prompt,
        max_new_tokens: int,
        sampling: Sampling = SAMPLE,
        *,
        stop_token: int | Sequence[int] | None = None,
        cache: bool = True,
        kv_cache: KVCache | None = None,
    ) -> Iterator[Int[Tensor, "*B"]]:
        """`stream(decoder, ...)`: the new tokens one step at a time."""
        return stream(
            self,
            prompt_ids,
            max_new_tokens,
            sampling,
            stop_token=stop_token,
            cache=cache,
            kv_cache=kv_cache,
        )


def stream(
    model: DecodingModel,
    prompt_ids: Prompt,
    max_new_tokens: int,
    sampling: Sampling = SAMPLE,
    *,
    stop_token: int | Sequence[int] | None = None,
    cache: bool = True,
    kv_cache: KVCache | None = None,
) -> Iterator[Int[Tensor, "*B"]]:
    """Yield the new tokens one step at a time: a `(B,)` tensor per step (a 0-d one for a
    single 1-d prompt), each picked as `sampling` says. `stop_token`: an id, or several (end of
    text, end of turn); a sequence that produced one yields it from then on (the first, in a
    batch), while the others go on; the iteration ends when all have stopped, or after
    `max_new_tokens`. `cache=False` recomputes the whole sequence at every step (the reference,
    and the way for a component that declares 'nocache'). `kv_cache`: a cache to continue (a
    chat's earlier turns, unpadded, of the same batch): the prompt is what follows what it
    holds; the last token sampled is never fed into it. Every check runs here, before the
    first step."""
    if not isinstance(sampling, Sampling):
        raise GenerationError(
            f"sampling must be a Sampling, e.g. Sampling(temperature=0.8, top_p=0.95, seed=0) "
            f"or GREEDY (lmcore.model.generate), got {sampling!r:.60}"
        )
    ids, real, single = prompt_batch(model, prompt_ids)
    past = 0
    if kv_cache is not None:
        if (
            not cache
            or real is not None
            or kv_cache.batch != ids.shape[0]
            or kv_cache.pads is not None
        ):
            raise GenerationError(
                "kv_cache continues unpadded prompts of the cache's batch size with cache=True"
            )
        past = kv_cache.length
    _check_options(model, ids, real, max_new_tokens, stop_token, past)
    if cache:
        check_cache_support(model)
    stops = None
    if stop_token is not None:
        listed = [stop_token] if isinstance(stop_token, int) else list(stop_token)
        stops = torch.tensor(listed, dtype=torch.long, device=ids.device)
    generator = sampling.generator(ids.device)
    _join(model)
    steps = _steps(model, ids, real, max_new_tokens, sampling, stops, generator, cache, kv_cache)
    return (tok[0] for tok in steps) if single else steps


def _steps(
    model: DecodingModel,
    ids: Tensor,
    real: Tensor | None,
    max_new_tokens: int,
    sampling: Sampling,
    stops: Tensor | None,
    generator: torch.Generator | None,
    use_cache: bool,
    kv_cache: KVCache | None = None,
) -> Iterator[Tensor]:
    batch, prompt_len = ids.shape
    # Grad mode is set around each step, never across a yield (it would leak to the caller).
    with torch.inference_mode():
        kv = kv_cache if kv_cache is not None else KVCache.for_model(model, batch)
        # Room for the request, once: its last token is sampled, never fed back (without a
        # cache, every step refills it from slot 0).
        kv.reserve((kv.length if use_cache else 0) + prompt_len + max(max_new_tokens - 1, 0))
        if not use_cache:  # the whole sequence so far, refilled at every step
            tokens = torch.zeros(
                batch, prompt_len + max_new_tokens, dtype=torch.long, device=ids.device
            )
            tokens[:, :prompt_len] = ids
        finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        new: Tensor = ids.clone()  # an inference tensor like every later step's (one compile)
    for step in range(max_new_tokens):
        with torch.inference_mode():
            if use_cache:  # the prompt first, then one token at a time
                if real is not None and step == 0:
                    kv.pad(real)
                logits = model.forward_unchecked(
                    new, kv.next_positions(new.shape[1]), kv, last=True
                )
            else:
                kv.reset()
                if real is not None:
                    kv.pad(real)
                seq = tokens[:, : prompt_len + step]
                logits = model.forward_unchecked(
                    seq, kv.next_positions(seq.shape[1]), kv, last=True
                )
            tok = sample(logits[:, -1], sampling, generator)  # (B,)
            if stops is not None:
                tok = torch.where(finished, stops[0], tok)
                finished |= torch.isin(tok, stops)
            if not use_cache:
                tokens[:, prompt_len + step] = tok
            new = tok[:, None]  # (B, 1)
        yield tok
        if stops is not None and bool(finished.all()):
            return


def generate(
    model: DecodingModel,
    prompt_ids: Prompt,
    max_new_tokens: int,
    sampling: Sampling = SAMPLE,
    *,
    stop_token: int | Sequence[int] | None = None,
    cache: bool = True,
) -> Int[Tensor, "*B new"]:
    """The new token ids, `(B, new)` (`(new,)` for a single 1-d prompt), `new <=
    max_new_tokens`: fewer when every sequence reached a `stop_token`; a sequence that stopped
    earlier than the others is filled with its (first) stop token after it. See `stream`."""
    steps = list(
        stream(model, prompt_ids, max_new_tokens, sampling, stop_token=stop_token, cache=cache)
    )
    if not steps:
        ids, _, single = prompt_batch(model, prompt_ids)
        empty = torch.zeros(ids.shape[0], 0, dtype=torch.long, device=ids.device)
        return empty[0] if single else empty
    return torch.stack(steps, dim=-1)
