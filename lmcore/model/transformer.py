"""Causal multi-head self-attention, the layers and the language model.

Read top to bottom: `CausalSelfAttention` projects heads (optionally with biases and q/k norms)
and hands them to the attention kernel component; `build_layer` builds one layer's attention,
feed-forward network and block component (which wires them and its norms around the residual
stream); `TransformerLM` embeds tokens, applies each positional encoding once per forward and
runs the layers.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from lmcore.blueprint import Blueprint, resolve
from lmcore.components import KINDS, Component
from lmcore.errors import (CheckpointError, GenerationError, ModelInputError,
                           ModelTooLargeError, PluginError, StateDictError, one_of)  # fmt: skip
from lmcore.interfaces import LayerContext
from lmcore.model import generate as decoding
from lmcore.model import saving
from lmcore.model.adapters import adapted, adapter_state, apply_adapter
from lmcore.model.cache import DecodingCache, KVState
from lmcore.model.counting import check_size
from lmcore.model.documents import document_positions
from lmcore.model.inputs import (check_device, check_documents, check_dtype, check_ids,
                                 check_positions)  # fmt: skip
from lmcore.model.nn import Embedding, Linear, LogitCap, products
from lmcore.model.parametrization import parametrize, query_factor
from lmcore.model.quant import apply_quant
from lmcore.model.roles import EMBEDDING, HEAD, SCALAR, Role
from lmcore.registry import Registry
from lmcore.spec import ModelSpec, default_query_scale
from lmcore.tokenizer import SavedTokenizer


class CausalSelfAttention(nn.Module):
    """Multi-head (or grouped-query) causal self-attention with `head_dim`-wide heads.

    `x → q, k, v` (k and v for `num_kv_heads` heads) `→ q_norm, k_norm` (a norm over each head,
    or over the full width with `qk_norm_full`) `→` the positional rotation `→` the kernel
    `→` (with `gate`: `· sigmoid(gate_proj(x))`, per head and channel, Qwen3-Next's gated
    attention) `→ output_proj`. `kernel_options` go to every kernel call (`scale`, `softcap`,
    `window`); `q_factor` multiplies q for a kernel that takes no `scale`. With `sinks`, the
    parameter `sinks (num_heads,)` (gpt-oss's per-head logit in the softmax's denominator,
    initialised to 0) goes to every kernel call as `sinks=`.

    State-dict keys: q_proj, k_proj, v_proj, output_proj (each `.weight`, and `.bias` with
    `qkv_bias` / `out_bias`), gate_proj with a gate (`.bias` with `qkv_bias`: Qwen3-Next
    computes it as the second half of each head's rows of its q_proj), sinks, and q_norm,
    k_norm with a qk_norm.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        num_kv_heads: int,
        kernel: nn.Module,
        kernel_gqa: bool,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        qk_norm_full: bool = False,
        kernel_options: Mapping[str, Any] | None = None,
        q_factor: float | None = None,
        gate: bool = False,
        sinks: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = head_dim or d_model // num_heads
        self.kernel_gqa = kernel_gqa
        width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.q_proj = Linear(d_model, width, device=device, dtype=dtype, bias=qkv_bias)
        self.k_proj = Linear(d_model, kv_width, device=device, dtype=dtype, bias=qkv_bias)
        self.v_proj = Linear(d_model, kv_width, device=device, dtype=dtype, bias=qkv_bias)
        self.output_proj = Linear(width, d_model, device=device, dtype=dtype, bias=out_bias)
        self.gate_proj = (
            Linear(d_model, width, device=device, dtype=dtype, bias=qkv_bias) if gate else None
        )
        self.sinks = (
            nn.Parameter(torch.zeros(num_heads, device=device, dtype=dtype)) if sinks else None
        )
        self.kernel = kernel
        self.q_norm, self.k_norm = q_norm, k_norm
        self.qk_norm_full = qk_norm_full
        self.kernel_options = dict(kernel_options or {})
        self.q_factor = q_factor

    joinable = ("q_proj", "k_proj", "v_proj")  # x's products, joined at inference

    def parameter_roles(self) -> dict[str, Role]:
        return {"sinks": SCALAR}  # a logit per head: neither a matrix nor a gain

    def decoding_state(
        self,
        *,
        batch: int,
        context_length: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVState:
        """The keys and values of `batch` sequences in `context_length` slots (the cache's
        capacity), after the rotation and the query-independent norms, before any repeat."""
        return KVState.empty(
            batch=batch,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            context_length=context_length,
            device=device,
            dtype=dtype,
        )

    def forward(
        self, x: Float[Tensor, "B T d_model"], context: LayerContext
    ) -> Float[Tensor, "B T d_model"]:
        rotation, bias, mask, cache = context.rotation, context.bias, context.mask, context.cache
        q, k, v = products(self, x, self.q_proj, self.k_proj, self.v_proj)  # (B, T, width)
        v = split_heads(v, self.num_kv_heads)  # (B, Hkv, T, D)
        if self.q_norm is None or self.k_norm is None:
            q, k = split_heads(q, self.num_heads), split_heads(k, self.num_kv_heads)
        elif self.qk_norm_full:  # one norm over all heads (OLMo 2)
            q = split_heads(self.q_norm(q), self.num_heads)
            k = split_heads(self.k_norm(k), self.num_kv_heads)
        else:  # over each head (Qwen 3)
            q = self.q_norm(q.unflatten(-1, (self.num_heads, self.head_dim))).transpose(1, 2)
            k = self.k_norm(k.unflatten(-1, (self.num_kv_heads, self.head_dim))).transpose(1, 2)
        if rotation is not None:  # RoPE-style encodings rotate q and k, never v
            q, k = rotation(q), rotation(k)
        if self.q_factor is not None:  # the query scale, for a kernel that takes none
            q = q * self.q_factor
        if cache is not None:  # keys are cached rotated: only the new ones are rotated here
            k, v = cache.update(k, v)  # (B, Hkv, Sk, D), Sk = cached + T
        if self.num_kv_heads != self.num_heads and not self.kernel_gqa:
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # Sq = T queries against Sk keys: the kernel aligns causal queries to the end. Only a
        # padded batch passes a mask, so kernels without 'mask' serve everything else.
        kw = self.kernel_options if mask is None else {**self.kernel_options, "mask": mask}
        if self.sinks is not None:
            kw = {**kw, "sinks": local(self.sinks)}
        if context.documents is not None:  # packed rows: block-causal within each document
            kw = {**kw, "documents": context.documents}
        out = self.kernel(q, k, v, causal=True, bias=bias, **kw)  # (B, H, T, D)
        heads = out.transpose(1, 2)  # (B, T, H, D)
        if torch.is_grad_enabled():
            # A copy, never a view of `out`: a kernel may keep `out` for its backward, and
            # output_proj (or the gate's product) keeps its input; a view (one token, or one
            # head) would hold one storage twice in the activations each declares.
            heads = heads.clone(memory_format=torch.contiguous_format)
        flat = heads.flatten(2)  # (B, T, H·D)
        if self.gate_proj is not None:  # after q_proj, which keeps x first
            flat = flat * torch.sigmoid(self.gate_proj(x))
        y: Tensor = self.output_proj(flat)
        return y


def local(t: Tensor) -> Tensor:
    """This rank's part of a parameter tensor parallelism shards (a DTensor); others as is."""
    to_local = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


def split_heads(x: Float[Tensor, "B T HD"], num_heads: int) -> Float[Tensor, "B H T D"]:
    """`b t (h d) -> b h t d` as a view (einops' rearrange costs more than the views on a
    decoding step's one token)."""
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads).transpose(1, 2)


def build_attention(bp: Blueprint, **factory: Any) -> CausalSelfAttention:
    """One layer's attention, from its blueprint (`Blueprint.layer(i)`): the kernel, the
    projections, and the q/k norms of a `qk_norm`."""
    spec = bp.spec
    options: dict[str, Any] = {}
    q_factor = None
    query_scale = spec.query_scale * query_factor(bp)  # muP's 1/d attention (else × 1.0)
    if query_scale != default_query_scale(spec.head_dim):
        if "scale" in bp.features("attn"):
            options["scale"] = query_scale
        else:
            q_factor = query_scale * math.sqrt(spec.head_dim)
    if spec.attn_softcap:
        options["softcap"] = spec.attn_softcap
    if spec.window:
        options["window"] = spec.window
    kernel = bp.create("attn", **factory)
    attn = CausalSelfAttention(
        d_model=spec.d_model,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        kernel=kernel,
        kernel_gqa=bp.kernel_gqa,
        qkv_bias=spec.qkv_bias,
        out_bias=spec.out_bias,
        qk_norm_full=spec.qk_norm_scope == "full",
        kernel_options=options,
        q_factor=q_factor,
        gate=spec.attn_gate,
        sinks=spec.attn_sinks,
        **factory,
    )
    if "qk_norm" in bp.parts:
        full = spec.qk_norm_scope == "full"
        q_width = spec.head_dim * (spec.num_heads if full else 1)
        k_width = spec.head_dim * (spec.num_kv_heads if full else 1)
        attn.q_norm = bp.create("qk_norm", d_model=q_width, **factory)
        attn.k_norm = bp.create("qk_norm", d_model=k_width, **factory)
    return attn


def build_mixer(bp: Blueprint, **factory: Any) -> nn.Module:
    """The layer's token mixer from its blueprint, given `attention()` to build lmcore's
    attention sub-layer with; each one it builds is checked to be where its `attention`
    declaration says."""
    built: list[nn.Module] = []

    def attention() -> nn.Module:
        module = build_attention(bp, **factory)
        built.append(module)
        return module

    mixer: nn.Module = bp.create("mixer", attention=attention, **factory)
    paths = bp.attention_paths()
    held = [_submodule(mixer, path) for path in paths]
    if len(built) != len(paths) or any(h is not b for h, b in zip(held, built, strict=False)):
        entry = bp.entries["mixer"]
        raise PluginError(
            f"mixer {entry.name!r} from {entry.provenance}: it declares attention sub-layers at "
            f"{list(paths)!r}, built {len(built)} with attention(), and must keep them at those "
            "paths (in that order; '' for the mixer itself), so that the state dict and the "
            "accounting agree with it"
        )
    return mixer


def _submodule(module: nn.Module, path: str) -> nn.Module | None:
    if not path:
        return module
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def build_layer(bp: Blueprint, **factory: Any) -> nn.Module:
    """One layer from its blueprint: its token mixer, feed-forward network, and the block that
    wires them with the norms it builds (`norm()`), each of them checked against its `norms`
    declaration."""
    attn = build_mixer(bp, **factory)
    ffn = bp.create("ffn", **factory)
    built: list[nn.Module] = []

    def norm() -> nn.Module:
        module: nn.Module = bp.create("norm", **factory)
        built.append(module)
        return module

    block: nn.Module = bp.create("block", attn=attn, ffn=ffn, norm=norm, **factory)
    names = bp.norm_names()
    held = [getattr(block, name, None) for name in names]
    if (
        len(built) != len(names)
        or any(h is not b for h, b in zip(held, built, strict=False))
        or getattr(block, "attn", None) is not attn
        or getattr(block, "ffn", None) is not ffn
    ):
        entry = bp.entries["block"]
        raise PluginError(
            f"block {entry.name!r} from {entry.provenance}: it declares norms {names!r}, built "
            f"{len(built)} with norm(), and must keep them as those attributes (in that order) "
            "and its mixer and ffn as `attn` and `ffn`, so that the state dict and the accounting "
            "agree with it"
        )
    return block


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
        # A blueprint is resolved already: it is used as it is unless another registry is asked for.
        self.blueprint = bp = (
            spec if isinstance(spec, Blueprint) and registry is None else resolve(spec, registry)
        )
        self.spec = spec = bp.spec
        device, dtype = check_device(device), check_dtype(dtype)
        check_size(bp, device=device, dtype=dtype, max_bytes=max_bytes)  # before any allocation
        self.build_device = device
        # The model's own tokenizer (`lmcore.load` sets it from the checkpoint; `save` keeps it).
        self.tokenizer: SavedTokenizer | None = None
        # The base checkpoint an adapter applies to (`lmcore.checkpoint.base_identity`), when
        # the base was loaded from one: `save` then writes the adapter's weights alone.
        self.adapter_base: dict[str, str] | None = None
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.token_embeddings = Embedding(spec.vocab_size, spec.d_model, **factory)
        # One instance per distinct positional encoding (the whole model's, then each one some
        # layers have instead): position work is done once per forward, not once per layer.
        self.pos = bp.create("pos", **factory)
        variants = sorted({b.spec.pos for b in bp.layers} - {spec.pos}, key=str)
        self.layer_pos = nn.ModuleList(
            next(b for b in bp.layers if b.spec.pos == v).create("pos", **factory) for v in variants
        )
        self.pos_index = [0 if b.spec.pos == spec.pos else 1 + variants.index(b.spec.pos)
                          for b in bp.layers]  # fmt: skip
        self.layers = nn.ModuleList(build_layer(b, **factory) for b in bp.layers)
        self.ln_final = bp.create("norm", **factory)
        self.lm_head = Linear(spec.d_model, spec.vocab_size, **factory)
        self.logit_cap = LogitCap(spec.logit_softcap) if spec.logit_softcap else None
        # The embedding scale in each dtype the model may run in, worked out here: no struct
        # call in the forward for torch.compile to trace.
        self.embed_scales = {dt: rounded(spec.embed_scale, dt) for dt in _FLOATS}
        if spec.tie_embeddings:
            # The shared matrix keeps lm_head's initialisation: σ=1 rows would make the initial
            # logits sqrt(d_model) times too large.
            self.token_embeddings.weight = self.lm_head.weight
            self.register_load_state_dict_pre_hook(refuse_untied_state_dict)  # type: ignore[no-untyped-call]
        self.logit_scale = spec.logit_scale * parametrize(self)  # muP: draws, × base/width
        if "quant" in bp.parts:  # after the base is whole: it stores the base's matrices
            apply_quant(self, bp.parts["quant"], device=device)
        if "adapter" in bp.parts:  # after the base is whole: it targets the base's matrices
            apply_adapter(self, bp.parts["adapter"], **factory)

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, str] | None = None,
        tokenizer: SavedTokenizer | None = None,
        full: bool = False,
    ) -> Path:
        """Save to one safetensors file with the spec and plugin provenance (`lmcore.save`;
        `lmcore.load` reads it back); `tokenizer` defaults to the model's own. A model with an
        adapter whose base came from a checkpoint (`adapter_base`) saves the adapter's weights
        alone, with the base's identity, unless `full`."""
        if self.adapter_base is not None and not full and adapted(self):
            dest = Path(path)
            base = dict(self.adapter_base)
            base["relative"] = os.path.relpath(base["path"], dest.parent.resolve())
            return saving.write(dest, self.blueprint, adapter_state(self), metadata=metadata,
                                base=base)  # fmt: skip
        return saving.write(
            path,
            self.blueprint,
            self.state_dict(),
            metadata=metadata,
            tokenizer=tokenizer or self.tokenizer,
        )

    def generate(
        self,
        prompt_ids: decoding.Prompt,
        max_new_tokens: int,
        sampling: decoding.Sampling = decoding.SAMPLE,
        *,
        stop_token: int | Sequence[int] | None = None,
        cache: bool = True,
    ) -> Int[Tensor, "*B new"]:
        """The new token ids after `prompt_ids`, each picked as `sampling` says (`GREEDY`: the
        most likely), with a KV cache: `lmcore.model.generate.generate`."""
        return decoding.generate(
            self, prompt_ids, max_new_tokens, sampling, stop_token=stop_token, cache=cache
        )

    def stream(
        self,
        prompt_ids: decoding.Prompt,
        max_new_tokens: int,
        sampling: decoding.Sampling = decoding.SAMPLE,
        *,
        stop_token: int | Sequence[int] | None = None,
        cache: bool = True,
        kv_cache: DecodingCache | None = None,
    ) -> Iterator[Int[Tensor, "*B"]]:
        """`generate` one step at a time: yields each step's new tokens as they are produced
        (`lmcore.model.generate.stream`)."""
        return decoding.stream(
            self,
            prompt_ids,
            max_new_tokens,
            sampling,
            stop_token=stop_token,
            cache=cache,
            kv_cache=kv_cache,
        )

    def decoding_states(self, batch: int, slots: int | None = None) -> list[tuple[str, Any]]:
        """Each layer's decoding state for `batch` sequences, as its mixer makes it (on the
        model's device, in its dtype, for `slots` positions: default its whole context), with
        the mixer's name; a `GenerationError` naming a mixer that has none."""
        weight = self.lm_head.weight
        out = []
        for i, layer in enumerate(self.layers):
            mixer = getattr(layer, "attn", None)
            name = self.blueprint.layer(i).parts["mixer"].name
            make = getattr(mixer, "decoding_state", None)
            if make is None:
                raise GenerationError(
                    f"layer {i}'s mixer {name!r} has no decoding_state(): it cannot decode with "
                    "a cache; generate with cache=False or declare 'nocache'"
                )
            state = make(
                batch=batch,
                context_length=self.spec.context_length if slots is None else slots,
                device=weight.device,
                dtype=weight.dtype,
            )
            out.append((name, state))
        return out

    @property
    def components(self) -> dict[str, Component]:
        """The component behind each kind, as the registry provided it."""
        return {kind: self.blueprint.component(kind) for kind in KINDS}

    def forward(
        self,
        in_indices: Int[Tensor, "... T"],
        token_positions: Int[Tensor, "... T"] | None = None,
        *,
        cache: DecodingCache | None = None,
        documents: Int[Tensor, "... T"] | None = None,
    ) -> Float[Tensor, "... T vocab_size"]:
        """Logits for every position. With a `cache` (`DecodingCache.for_model(model, batch)`), the
        ids `(B, T)` are appended to the cached sequences: their positions continue from the
        cache's (unless given) and they attend to every cached key.

        With `documents` (the ids' shape, int64 document ids non-decreasing along each row,
        e.g. ``0 0 0 1 1 2 2 2``), each row is a packed row of documents: attention is
        block-causal within each document, recurrent states and convolutions restart at each
        document's first token, and positions restart at 0 there (unless `token_positions`
        are given), for every positional encoding; each document's logits are what it gives
        alone. Every layer's mixer, and its attention kernel, must declare 'documents'; a
        cache with documents is refused (decode each document with a cache of its own)."""
        spec = self.spec
        ids = check_ids(
            in_indices,
            vocab_size=spec.vocab_size,
            context_length=spec.context_length,
            device=self.lm_head.weight.device,
        )
        lead, seq = ids.shape[:-1], ids.shape[-1]
        ids = ids.reshape(-1, seq)  # (B, T)
        if documents is not None:
            documents = self._documents(documents, ids, cache)
            if token_positions is None:  # each document starts at position 0
                token_positions = document_positions(documents)
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
        logits = self.forward_unchecked(ids, positions, cache, documents)
        return logits.reshape(*lead, seq, spec.vocab_size)  # an empty batch has no -1 to infer

    def _documents(
        self, documents: object, ids: Int[Tensor, "B T"], cache: DecodingCache | None
    ) -> Int[Tensor, "B T"]:
        """The checked `(B, T)` document ids, once every layer can take them."""
        if cache is not None:
            raise ModelInputError(
                "documents and a KV cache cannot be given together: a cache continues one "
                "sequence per row; decode each document with a cache of its own"
            )
        refused = self.blueprint.documents()
        if refused is not None:
            kind, name, able = refused
            other = "a kernel" if kind == "attn" else "a mixer"
            raise ModelInputError(
                f"documents (packed rows, --doc-mask) need every layer to keep documents apart, "
                f"but {kind} {name!r} does not declare 'documents'; use {other} that does: "
                f"{one_of(able)}, or train without documents"
            )
        return check_documents(documents, ids)

    def forward_unchecked(
        self,
        ids: Int[Tensor, "B T"],
        positions: Int[Tensor, "B_or_1 T"],
        cache: DecodingCache | None = None,
        documents: Int[Tensor, "B T"] | None = None,
        last: bool = False,
        layers: Sequence[Callable[[Tensor, LayerContext], Tensor]] | None = None,
        head: Callable[[Tensor], Tensor] | None = None,
    ) -> Float[Tensor, "B T_or_1 vocab_size"]:
        """`forward` without its input checks, for callers that checked once (generation
        checks a prompt's ids up front, then feeds back ids it sampled itself): no value
        check, so no device synchronisation per step. `documents` as `forward` takes them
        (checked; `positions` already within each document). `last`: the last position's
        logits only, `(B, 1, vocab_size)` (generation's: no head product for the others).
        `layers`: callables run in place of `self.layers`, one each, called as the layer is,
        and `head` in place of `self.head` (`compile_decoding`'s compiled regions)."""
        spec = self.spec
        if layers is not None and len(layers) != len(self.layers):
            raise ValueError(f"layers: {len(layers)} callables for {len(self.layers)} layers")
        x = self.token_embeddings(ids)  # (B, T, d_model)
        if spec.embed_scale != 1.0:  # Gemma: the scale rounded to the model's dtype, as there
            x = x * self.embed_scales.get(x.dtype, spec.embed_scale)
        x = self.pos.embed(x, positions)  # absolute encodings embed at the given positions
        mask = None
        if cache is None:
            k_positions = positions
        else:
            cache.record(positions)
            k_positions = cache.key_positions(ids.shape[1])
            mask = cache.mask(ids.shape[1])
        contexts = [
            LayerContext(
                pos.rotation(positions),  # rotates the new q and k only
                pos.attention_bias(positions, k_positions),  # (..., H, T, Sk) or None
                mask,
                positions=positions,
                documents=documents,
            )
            for pos in (self.pos, *self.layer_pos)
        ]
        views = None if cache is None else cache.layers(ids.shape[1])
        calls: Sequence[Callable[[Tensor, LayerContext], Tensor]] = layers or list(self.layers)
        for i, layer in enumerate(calls):
            context = contexts[self.pos_index[i]]
            if views is not None:
                context = context._replace(cache=views[i])
            x = layer(x, context)
        if cache is not None:
            cache.advance(ids.shape[1])
        # generation samples from the last position only (one layout for any prompt's length,
        # so a compiled head traces once)
        x = x[:, -1:].contiguous() if last else x
        return (head or self.head)(x)  # (B, T or 1, vocab_size)

    def head(self, x: Float[Tensor, "B T d_model"]) -> Float[Tensor, "B T vocab_size"]:
        """The logits of the last layer's output: the final norm, the output matrix, and the
        logit scale and cap of a spec that has them."""
        logits: Tensor = self.lm_head(self.ln_final(x))
        if self.logit_scale != 1.0:  # Falcon-H1's lm_head_multiplier; muP's output multiplier
            logits = logits * self.logit_scale
        if self.logit_cap is not None:
            logits = self.logit_cap(logits)
        return logits

    def parameter_roles(self) -> dict[str, Role]:
        """The output head's role; a tied matrix is the embedding (never a hidden matrix)."""
        if self.spec.tie_embeddings:
            return {"token_embeddings.weight": EMBEDDING}
        return {"lm_head.weight": HEAD}

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


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def rounded(value: float, dtype: torch.dtype) -> float:
    """`value` rounded to `dtype`, as `torch.tensor(value, dtype=dtype)` holds it (a bfloat16
    model multiplies by bfloat16's nearest value, as a reference multiplying by a tensor of the
    model's dtype does)."""
    if dtype == torch.float64:
        return value
    if dtype == torch.float16:
        half: float = struct.unpack("e", struct.pack("e", value))[0]
        return half
    single: float = struct.unpack("f", struct.pack("f", value))[0]
    if dtype != torch.bfloat16:
        return single
    bits: int = struct.unpack("I", struct.pack("f", single))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest, ties to even
    brain: float = struct.unpack("f", struct.pack("I", bits))[0]
    return brain


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
