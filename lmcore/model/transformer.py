"""Causal multi-head self-attention, the transformer block and the language model.

Read top to bottom: `CausalSelfAttention` projects heads and hands them to the attention kernel
component; `TransformerBlock` wires norm, attention and feed-forward in pre- or post-norm order;
`TransformerLM` embeds tokens, applies the positional encoding once per forward and runs the blocks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from lmcore.blueprint import Blueprint, resolve
from lmcore.components import KINDS, Component
from lmcore.errors import CheckpointError, ModelInputError, ModelTooLargeError, StateDictError
from lmcore.interfaces import Rotation
from lmcore.model import generate as decoding
from lmcore.model import saving
from lmcore.model.cache import KVCache, LayerCache
from lmcore.model.counting import check_size
from lmcore.model.inputs import check_device, check_dtype, check_ids, check_positions
from lmcore.model.nn import Embedding, Linear
from lmcore.registry import Registry
from lmcore.spec import ModelSpec


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention; `d_k = d_v = d_model / num_heads`.

    State-dict keys: q_proj, k_proj, v_proj, output_proj (k/v shrink to num_kv_heads heads).
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        num_kv_heads: int,
        kernel: nn.Module,
        kernel_gqa: bool,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        self.kernel_gqa = kernel_gqa
        kv_width = num_kv_heads * self.head_dim
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, kv_width, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, kv_width, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.kernel = kernel

    def forward(
        self,
        x: Float[Tensor, "B T d_model"],
        rotation: Rotation | None = None,
        bias: Float[Tensor, "... H T Sk"] | None = None,
        mask: Bool[Tensor, "B 1 T Sk"] | None = None,
        cache: LayerCache | None = None,
    ) -> Float[Tensor, "B T d_model"]:
        q = split_heads(self.q_proj(x), self.num_heads)  # (B, H, T, D)
        k = split_heads(self.k_proj(x), self.num_kv_heads)  # (B, Hkv, T, D)
        v = split_heads(self.v_proj(x), self.num_kv_heads)
        if rotation is not None:  # RoPE-style encodings rotate q and k, never v
            q, k = rotation(q), rotation(k)
        if cache is not None:  # keys are cached rotated: only the new ones are rotated here
            k, v = cache.update(k, v)  # (B, Hkv, Sk, D), Sk = cached + T
        if self.num_kv_heads != self.num_heads and not self.kernel_gqa:
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # Sq = T queries against Sk keys: the kernel aligns causal queries to the end. Only a
        # padded batch passes a mask, so kernels without 'mask' serve everything else.
        kw = {} if mask is None else {"mask": mask}
        out = self.kernel(q, k, v, causal=True, bias=bias, **kw)  # (B, H, T, D)
        heads = out.transpose(1, 2)  # (B, T, H, D)
        if torch.is_grad_enabled():
            # A copy, never a view of `out`: a kernel may keep `out` for its backward, and
            # output_proj keeps its input; with a view (one token, or one head) both would
            # hold the same storage and the activations declared for each would count it twice.
            heads = heads.clone(memory_format=torch.contiguous_format)
        y: Tensor = self.output_proj(heads.flatten(2))
        return y


def split_heads(x: Float[Tensor, "B T HD"], num_heads: int) -> Float[Tensor, "B H T D"]:
    """`b t (h d) -> b h t d` as a view (einops' rearrange costs more than the views on a
    decoding step's one token)."""
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads).transpose(1, 2)


class TransformerBlock(nn.Module):
    """Pre-norm: `y = x + attn(ln1(x)); z = y + ffn(ln2(y))`.
    Post-norm: `y = ln1(x + attn(x)); z = ln2(y + ffn(y))`."""

    def __init__(
        self,
        *,
        attn: CausalSelfAttention,
        ffn: nn.Module,
        ln1: nn.Module,
        ln2: nn.Module,
        postnorm: bool,
    ):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.ffn = ln1, attn, ln2, ffn
        self.postnorm = postnorm

    def forward(
        self,
        x: Float[Tensor, "B T d_model"],
        rotation: Rotation | None = None,
        bias: Float[Tensor, "... H T Sk"] | None = None,
        mask: Bool[Tensor, "B 1 T Sk"] | None = None,
        cache: LayerCache | None = None,
    ) -> Float[Tensor, "B T d_model"]:
        y: Tensor
        z: Tensor
        if self.postnorm:
            y = self.ln1(x + self.attn(x, rotation, bias, mask, cache))
            z = self.ln2(y + self.ffn(y))
        else:
            y = x + self.attn(self.ln1(x), rotation, bias, mask, cache)
            z = y + self.ffn(self.ln2(y))
        return z


class TransformerLM(nn.Module):
    """`token_embeddings → pos → layers → ln_final → lm_head`; returns unnormalised logits.

    Built from a `Blueprint` (or a spec, resolved once); `model.blueprint` holds the canonical,
    validated spec and the registry entry behind each component.
    """

    def __init__(
        self,
        spec: Blueprint | ModelSpec | str,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        registry: Registry | None = None,
        max_bytes: int | None = None,
    ):
        super().__init__()
        self.blueprint = bp = resolve(spec, registry)
        self.spec = spec = bp.spec
        device, dtype = check_device(device), check_dtype(dtype)
        check_size(bp, device=device, dtype=dtype, max_bytes=max_bytes)  # before any allocation
        factory: dict[str, Any] = {"device": device, "dtype": dtype}

        def make_attn() -> CausalSelfAttention:
            return CausalSelfAttention(
                d_model=spec.d_model,
                num_heads=spec.num_heads,
                num_kv_heads=spec.num_kv_heads,
                kernel=bp.create("attn", **factory),
                kernel_gqa=bp.kernel_gqa,
                **factory,
            )

        self.token_embeddings = Embedding(spec.vocab_size, spec.d_model, **factory)
        self.pos = bp.create(
            "pos", **factory
        )  # one instance: position work is done once per forward
        self.layers = nn.ModuleList(
            TransformerBlock(
                ln1=bp.create("norm", **factory),
                attn=make_attn(),
                ln2=bp.create("norm", **factory),
                ffn=bp.create("ffn", **factory),
                postnorm=spec.block == "postnorm",
            )
            for _ in range(spec.num_layers)
        )
        self.ln_final = bp.create("norm", **factory)
        self.lm_head = Linear(spec.d_model, spec.vocab_size, **factory)
        if spec.tie_embeddings:
            # The shared matrix keeps lm_head's initialisation: σ=1 rows would make the initial
            # logits sqrt(d_model) times too large.
            self.token_embeddings.weight = self.lm_head.weight
            self.register_load_state_dict_pre_hook(refuse_untied_state_dict)  # type: ignore[no-untyped-call]

    def save(
        self, path: str | os.PathLike[str], *, metadata: Mapping[str, str] | None = None
    ) -> Path:
        """Save to one safetensors file with the spec and plugin provenance (`lmcore.save`;
        `lmcore.load` reads it back)."""
        return saving.write(path, self.blueprint, self.state_dict(), metadata=metadata)

    def generate(
        self,
        prompt_ids: decoding.Prompt,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_token: int | None = None,
        seed: int | None = None,
        cache: bool = True,
    ) -> Int[Tensor, "*B new"]:
        """The new token ids after `prompt_ids` (temperature 0: greedy), with a KV cache:
        `lmcore.model.generate.generate`."""
        return decoding.generate(
            self,
            prompt_ids,
            max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_token=stop_token,
            seed=seed,
            cache=cache,
        )

    def stream(
        self,
        prompt_ids: decoding.Prompt,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int | None = None,
        stop_token: int | None = None,
        seed: int | None = None,
        cache: bool = True,
    ) -> Iterator[Int[Tensor, "*B"]]:
        """`generate` one step at a time: yields each step's new tokens as they are produced
        (`lmcore.model.generate.stream`)."""
        return decoding.stream(
            self,
            prompt_ids,
            max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop_token=stop_token,
            seed=seed,
            cache=cache,
        )

    @property
    def components(self) -> dict[str, Component]:
        """The component behind each kind, as the registry provided it."""
        return {kind: self.blueprint.component(kind) for kind in KINDS}

    def forward(
        self,
        in_indices: Int[Tensor, "... T"],
        token_positions: Int[Tensor, "... T"] | None = None,
        *,
        cache: KVCache | None = None,
    ) -> Float[Tensor, "... T vocab_size"]:
        """Logits for every position. With a `cache` (`KVCache.for_model(model, batch)`), the
        ids `(B, T)` are appended to the cached sequences: their positions continue from the
        cache's (unless given) and they attend to every cached key."""
        spec = self.spec
        ids = check_ids(
            in_indices,
            vocab_size=spec.vocab_size,
            context_length=spec.context_length,
            device=self.lm_head.weight.device,
        )
        lead, seq = ids.shape[:-1], ids.shape[-1]
        ids = ids.reshape(-1, seq)  # (B, T)
        if cache is not None:
            if ids.shape[0] != cache.batch or len(lead) != 1:
                raise ModelInputError(
                    f"token ids of shape {tuple(in_indices.shape)} do not fit a KV cache of "
                    f"batch {cache.batch}: give (batch, seq) = ({cache.batch}, T)"
                )
            cache.check_room(seq)
            if token_positions is None:
                token_positions = cache.next_positions(seq)
        positions = check_positions(token_positions, ids, context_length=spec.context_length)
        logits = self.forward_unchecked(ids, positions, cache)
        return logits.reshape(*lead, seq, spec.vocab_size)  # an empty batch has no -1 to infer

    def forward_unchecked(
        self,
        ids: Int[Tensor, "B T"],
        positions: Int[Tensor, "B_or_1 T"],
        cache: KVCache | None = None,
    ) -> Float[Tensor, "B T vocab_size"]:
        """`forward` without its input checks, for callers that checked once (generation
        checks a prompt's ids up front, then feeds back ids it sampled itself): no value
        check, so no device synchronisation per step."""
        x = self.token_embeddings(ids)  # (B, T, d_model)
        x = self.pos.embed(x, positions)  # absolute encodings embed at the given positions
        rotation = self.pos.rotation(positions)  # rotates the new q and k only
        mask = None
        if cache is None:
            k_positions = positions
        else:
            cache.record(positions)
            k_positions = cache.key_positions(ids.shape[1])
            mask = cache.mask(ids.shape[1])
        bias = self.pos.attention_bias(positions, k_positions)  # (..., H, T, Sk) or None
        for i, layer in enumerate(self.layers):
            x = layer(x, rotation, bias, mask, None if cache is None else cache.layer(i))
        if cache is not None:
            cache.advance(ids.shape[1])
        logits: Tensor = self.lm_head(self.ln_final(x))  # (B, T, vocab_size)
        return logits

    def aux_loss(self) -> Tensor | None:
        """The sum of the auxiliary losses the last forward left on its modules (an `aux_loss`
        tensor each, e.g. a mixture of experts' load balancing, already weighted by its
        coefficient), or None when none did: no such module, or a forward in eval mode or
        without gradients. A training loop adds it to the loss; `lmcore train` does, and logs
        it as `aux_loss`. Outside the compiled forward, so `torch.compile` sees none of it."""
        total: Tensor | None = None
        for module in self.modules():
            found = getattr(module, "aux_loss", None)
            if isinstance(found, Tensor):
                total = found if total is None else total + found
        return total


def refuse_untied_state_dict(
    module: nn.Module, state_dict: dict[str, Tensor], prefix: str, *_: Any
) -> None:
    """A tied model holds one matrix for `token_embeddings.weight` and `lm_head.weight`; a state
    dict giving two different ones (an untied checkpoint) cannot be loaded into it, since one
    would silently overwrite the other."""
    emb, head = (
        state_dict.get(f"{prefix}token_embeddings.weight"),
        state_dict.get(f"{prefix}lm_head.weight"),
    )
    if emb is None or head is None or emb is head:
        return
    same = emb.shape == head.shape and (
        emb.device.type == "meta"
        or head.device.type == "meta"
        or torch.equal(emb, head.to(emb.device))
    )
    if not same:
        raise StateDictError(
            f"this model ties its embeddings (tie_embeddings=true), but the state dict holds two "
            f"different matrices for {prefix}token_embeddings.weight and {prefix}lm_head.weight "
            "(an untied checkpoint, e.g. CS336's); loading it would keep only one of them. "
            "Build the model with tie_embeddings=false to load it"
        )


def build_model(
    spec: Blueprint | ModelSpec | str,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    registry: Registry | None = None,
    max_bytes: int | None = None,
    compile: bool | Mapping[str, Any] = False,
) -> TransformerLM:
    """Build a `TransformerLM` from a spec string (e.g. ``"tinystories, pos=nope"``), a
    `ModelSpec` or a resolved `Blueprint`.

    Before anything is allocated, the bytes of the weights and buffers are added up from the
    components' declarations and the build is refused (`ModelTooLargeError`, naming the total
    and the largest part) beyond `max_bytes` (default: the memory available on `device`; no
    limit on meta) or where torch could not index a module. `device="meta"` builds the
    structure without allocating weights. `compile=True` compiles the model in place with
    `torch.compile` (`nn.Module.compile`; a mapping is passed on as its options, e.g.
    ``{"backend": "aot_eager"}``): the result is still a `TransformerLM` with the same
    state-dict keys; the first forward (and backward) of each input shape compiles.
    """
    try:
        model = TransformerLM(
            spec, device=device, dtype=dtype, registry=registry, max_bytes=max_bytes
        )
    except (MemoryError, RuntimeError) as e:
        # What the declarations did not foresee (a component that declares no buffers, memory
        # taken meanwhile) still ends in a one-line error, not the allocator's.
        text = str(e)
        if not isinstance(e, MemoryError) and not any(s in text for s in _ALLOCATOR_ERRORS):
            raise
        raise ModelTooLargeError(
            f"allocating the model failed: {text.splitlines()[0] if text else type(e).__name__}"
        ) from e
    if compile:
        model.compile(**(compile if isinstance(compile, Mapping) else {}))
    return model


_ALLOCATOR_ERRORS = ("can't allocate memory", "out of memory", "Cannot allocate memory")


def unwrap(model: nn.Module) -> TransformerLM:
    """The TransformerLM inside `torch.compile` (`_orig_mod`) or DDP (`module`) wrappers."""
    inner: Any = model
    for _ in range(4):
        if isinstance(inner, TransformerLM):
            return inner
        inner = getattr(inner, "_orig_mod", None) or getattr(inner, "module", None)
        if inner is None:
            break
    raise CheckpointError(
        f"lmcore.save expects a TransformerLM (from lmcore.build_model or lmcore.load), got "
        f"{type(model).__name__}; for any other module use safetensors.torch.save_model"
    )
