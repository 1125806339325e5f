"""Sizes from the components' declarations, before any weight exists: parameters, forward FLOPs,
activations and buffers by row, and the size check every build runs first.

`account(spec)` adds up, row by row, what each component declares (`Component.params`,
`Component.flops`, `Component.activations`, `Component.buffers`) and what lmcore knows about its
own pieces: the token embeddings, the q/k/v/output projections (`num_heads · head_dim` wide, k
and v sized by `num_kv_heads`, with their biases) and `lm_head`, whose matmuls are counted here
by the 2·m·n·p rule, the capped logits, and what the next-token loss saves. A layer's norms are
the ones its block declares (`Component.norms`), each a row; a model whose layers differ
(`key[layers]=...`) has one set of layer rows per distinct layer, named by its layers
(`layers[0::2].attn.kernel`). Nothing is allocated and no model is built: `check_size` runs inside
`TransformerLM.__init__`, so this module sits below the transformer. What needs a built model
(the cross-check of declarations against modules, measured activations) is `lmcore.describe`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Final

import torch

from lmcore.blueprint import Blueprint, Part, resolve
from lmcore.components import count_state
from lmcore.errors import LmcoreError, LmcoreKeyError, ModelInputError, ModelTooLargeError
from lmcore.model.quant import weight_bytes
from lmcore.registry import Entry, Registry
from lmcore.spec import ModelSpec, format_layers


class AccountingError(LmcoreError, ValueError):
    """A component's declared parameter count disagrees with the module it builds."""


# Rows are grouped into parts for the FLOPs breakdown, in this order.
PARTS: Final = (
    "embeddings",
    "norms",
    "attention projections",
    "attention kernel",
    "mixer",
    "ffn",
    "block",
    "lm_head",
)
# Parts listed only when some row is in them (no built-in block holds anything of its own;
# the built-in attention mixer holds nothing beyond lmcore's attention rows).
OPTIONAL_PARTS: Final = frozenset({"mixer", "block"})


@dataclass(frozen=True)
class Row:
    """One module of the model, counted `count` times (once per layer for per-layer rows).

    `name` is the module's path, with `*` for the layer index (`layers.*.attn.q_proj`), or
    with the layers it stands for when they differ (`layers[0::2].attn.q_proj`, `layers`
    holding the indices). `flops_each` is the forward matmul FLOPs of one instance for the
    whole batch.
    """

    name: str
    part: str
    module: str  # what sits there: "norm=rmsnorm", "linear 512->512", ...
    count: int
    params_each: int
    flops_each: int
    entry: Entry | None = None  # the plugin component, or None for lmcore's own pieces
    # Bytes one instance saves for backward for the whole batch; None: the component declares none.
    activations_each: int | None = 0
    # Bytes of the buffers one instance holds; None: the component declares none.
    buffers_each: int | None = 0
    # Parameters one token uses (a mixture of experts: fewer than all); None: all of them.
    active_params_each: int | None = None
    layers: tuple[int, ...] | None = None  # the layers of a `layers[...]` row
    # Bytes one instance's build allocates beyond its weights and buffers, freed when it returns.
    temporaries_each: int = 0
    # The module objects one instance is (a mixture of experts: many); None: a few, as lmcore's
    # own pieces, within the per-layer estimate of the size check.
    modules_each: int | None = None
    # What the declarations were called with (the dimensions and arguments), for messages.
    kwargs: tuple[tuple[str, object], ...] = ()
    # The decoding state one instance keeps per sequence: (bytes per token of context, bytes
    # whatever the context); None: the mixer declares none. (0, 0) for rows that keep none.
    state_each: tuple[int, int] | None = (0, 0)

    @property
    def params(self) -> int:
        return self.params_each * self.count

    @property
    def active_params(self) -> int:
        each = self.params_each if self.active_params_each is None else self.active_params_each
        return each * self.count

    @property
    def flops(self) -> int:
        return self.flops_each * self.count

    @property
    def activations(self) -> int | None:
        return None if self.activations_each is None else self.activations_each * self.count

    @property
    def buffers(self) -> int | None:
        return None if self.buffers_each is None else self.buffers_each * self.count

    @property
    def per_layer(self) -> bool:
        return self.name.startswith(("layers.*", "layers["))

    def instances(self, num_layers: int) -> int:
        """How many modules this row stands for in a model of `num_layers` layers."""
        if self.layers is None:
            return min(num_layers, self.count) if self.per_layer else 1
        return sum(1 for i in self.layers if i < num_layers)

    def paths(self, num_layers: int) -> Iterator[str]:
        """The module paths this row stands for in a built `TransformerLM` (of `num_layers`
        layers, which may be fewer than the spec's)."""
        if self.layers is not None:
            leaf = self.name.split("]", 1)[1]
            for i in self.layers:
                if i < num_layers:
                    yield f"layers.{i}{leaf}"
        elif self.per_layer:
            for i in range(num_layers):
                yield self.name.replace("*", str(i), 1)
        else:
            yield self.name


@dataclass(frozen=True)
class Accounting:
    """Parameters, forward FLOPs and declared activations of a blueprint, by row, for `batch`
    sequences of `seq_len` in `dtype`; `loss_activations` is what the cross-entropy saves."""

    blueprint: Blueprint
    batch: int
    seq_len: int
    dtype: torch.dtype
    rows: tuple[Row, ...]
    loss_activations: int

    @property
    def spec(self) -> ModelSpec:
        return self.blueprint.spec

    @property
    def params(self) -> int:
        return sum(r.params for r in self.rows)

    @property
    def active_params(self) -> int:
        """Parameters one token's forward uses: `params` but for the experts a mixture of
        experts does not route it to."""
        return sum(r.active_params for r in self.rows)

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token of the batch (`flops` counts what is actually computed)."""
        return self.flops / (self.batch * self.seq_len)

    @property
    def uniform(self) -> bool:
        """Whether every layer is the same (no `key[layers]=...`)."""
        return not self.spec.layers

    @property
    def layer_params(self) -> int:
        """Parameters of one layer; the mean over the layers (rounded down) when they differ."""
        return sum(r.params for r in self.rows if r.per_layer) // self.spec.num_layers

    @property
    def layer_flops(self) -> int:
        """Forward FLOPs of one layer; the mean over the layers when they differ."""
        return sum(r.flops for r in self.rows if r.per_layer) // self.spec.num_layers

    def layer_groups(self) -> list[tuple[str, int, int, int]]:
        """`(layers, count, params, flops)` of one layer of each distinct kind, `layers` as the
        spec writes them (`0::2`; `*` when every layer is the same)."""
        out: dict[str, list[int]] = {}
        for r in self.rows:
            if r.per_layer:
                key = "*" if r.layers is None else r.name[len("layers[") :].split("]", 1)[0]
                got = out.setdefault(key, [r.count, 0, 0])
                got[1] += r.params_each
                got[2] += r.flops_each
        return [(key, n, params, flops) for key, (n, params, flops) in out.items()]

    @property
    def undeclared(self) -> tuple[Row, ...]:
        """Rows whose component declares no activations."""
        return tuple(r for r in self.rows if r.activations_each is None)

    def decoding_state(self, rows: tuple[Row, ...] | None = None) -> tuple[int, int] | None:
        """`(per_token, per_sequence)`: the bytes of one sequence's decoding state, summed over
        `rows` (default: all), each token of context and whatever the context; None when a
        mixer among them declares none."""
        per_token = per_sequence = 0
        for r in self.rows if rows is None else rows:
            if r.state_each is None:
                return None
            per_token += r.state_each[0] * r.count
            per_sequence += r.state_each[1] * r.count
        return per_token, per_sequence

    def state_bytes(self, context: int | None = None, batch: int = 1) -> int | None:
        """Bytes of the decoding state of `batch` sequences at `context` tokens (default: the
        context length, what the cache preallocates); None when a mixer declares none."""
        found = self.decoding_state()
        if found is None:
            return None
        context = self.spec.context_length if context is None else context
        return batch * (found[0] * context + found[1])

    def layer_states(self) -> list[tuple[str, int, tuple[int, int] | None]]:
        """`(layers, count, state)` of one layer of each distinct kind, as `layer_groups`:
        its decoding state per sequence, `(per_token, per_sequence)` bytes, or None."""
        out: dict[str, list[Row]] = {}
        for r in self.rows:
            if r.per_layer:
                key = "*" if r.layers is None else r.name[len("layers[") :].split("]", 1)[0]
                out.setdefault(key, []).append(r)
        found = []
        for key, rows in out.items():
            one = tuple(replace(r, count=1) for r in rows)
            found.append((key, rows[0].count, self.decoding_state(one)))
        return found

    def undeclared_components(self) -> list[str]:
        """``norm 'plain'`` for each component that declares no activations, sorted."""
        return sorted({f"{r.entry.kind} {r.entry.name!r}" for r in self.undeclared if r.entry})

    @property
    def activations(self) -> int | None:
        """Declared activation bytes of forward + loss; None if a component declares none."""
        if self.undeclared:
            return None
        return sum(r.activations or 0 for r in self.rows) + self.loss_activations

    def declared_activations(self) -> dict[str, int]:
        """Declared bytes by row name, plus `loss`; only when every component declares them."""
        if self.undeclared:
            names = ", ".join(self.undeclared_components())
            raise AccountingError(f"no activation declaration from {names}")
        return {**{r.name: r.activations or 0 for r in self.rows}, "loss": self.loss_activations}

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise LmcoreKeyError(f"no row {name!r}; rows are {', '.join(r.name for r in self.rows)}")

    def params_share(self, row: Row) -> float:
        return row.params / self.params if self.params else 0.0

    def flops_share(self, row: Row) -> float:
        return row.flops / self.flops if self.flops else 0.0

    def parts(self) -> tuple[str, ...]:
        """`PARTS`, without the optional ones no row is in."""
        used = {r.part for r in self.rows}
        return tuple(p for p in PARTS if p not in OPTIONAL_PARTS or p in used)

    def flops_by_part(self) -> dict[str, int]:
        return {part: sum(r.flops for r in self.rows if r.part == part) for part in self.parts()}


def activation_kwargs(
    bp: Blueprint, kind: str, *, batch: int, seq_len: int, dtype: torch.dtype
) -> dict[str, object]:
    """`bp.kwargs(kind)` plus what an `activations` declaration also gets, for `batch`
    sequences of `seq_len` (a plain forward: kv_len = seq_len)."""
    shape = {"batch": batch, "seq_len": seq_len, "kv_len": seq_len, "dtype": dtype}
    return {**bp.kwargs(kind), **shape, "num_layers": bp.spec.num_layers}


def account(
    spec: Blueprint | ModelSpec | str,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    registry: Registry | None = None,
) -> Accounting:
    """Count parameters, forward FLOPs and activations from the declarations alone; `seq_len`
    defaults to the context length."""
    bp = spec if isinstance(spec, Blueprint) and registry is None else resolve(spec, registry)
    spec = bp.spec
    seq = spec.context_length if seq_len is None else seq_len
    _check_shape(spec, batch, seq)
    d, vocab, n_layers = spec.d_model, spec.vocab_size, spec.num_layers
    tokens, size = batch * seq, dtype.itemsize
    shape = {"batch": batch, "kv_len": seq, "dtype": dtype}

    def declared(
        part: Part, kwargs: dict[str, Any], name: str, group: str, count: int, *,
        layers: tuple[int, ...] | None = None, rows: int = 1, uses: int = n_layers,
    ) -> Row:  # fmt: skip
        # Components declare FLOPs for one sequence; a plain forward has kv_len = seq_len.
        # `rows`: a per-head norm sees `rows` vectors per token; `uses`: the layers a pos serves.
        entry = part.entry
        flops = entry.count("flops", {**kwargs, "seq_len": seq * rows, "kv_len": seq})
        saved = {**kwargs, **shape, "seq_len": seq * rows, "num_layers": uses}
        return Row(
            name=name,
            part=group,
            module=f"{entry.kind}={entry.name}",
            count=count,
            params_each=entry.count("params", kwargs) or 0,
            flops_each=batch * (flops or 0),
            entry=entry,
            activations_each=entry.count("activations", saved),
            buffers_each=entry.count("buffers", {**kwargs, "dtype": dtype}),
            active_params_each=entry.count("active_params", kwargs),
            layers=layers,
            temporaries_each=entry.count("temporaries", {**kwargs, "dtype": dtype}) or 0,
            modules_each=entry.count("modules", kwargs),
            kwargs=tuple(kwargs.items()),
            state_each=(
                count_state(entry.component, {**kwargs, "dtype": dtype}, entry.provenance)
                if entry.kind == "mixer"
                else (0, 0)
            ),
        )

    def linear(
        name: str, d_in: int, d_out: int, count: int, saves_input: bool, *,
        bias: bool = False, layers: tuple[int, ...] | None = None,
    ) -> Row:  # fmt: skip
        return Row(
            name=name,
            part="lm_head" if name == "lm_head" else "attention projections",
            module=f"linear {d_in}->{d_out}" + (" +bias" if bias else ""),
            count=count,
            params_each=d_in * d_out + (d_out if bias else 0),
            flops_each=2 * tokens * d_in * d_out,
            # x @ W.T keeps x for W's gradient; q, k and v share theirs, counted at q_proj.
            activations_each=tokens * d_in * size if saves_input else 0,
            layers=layers,
        )

    def attention(lbp: Blueprint, at: str, count: int, shared: bool,
                  layers: tuple[int, ...] | None) -> list[Row]:  # fmt: skip
        """The rows of one attention sub-layer at path `at`: lmcore's projections, the kernel
        (with the keys and values it is handed, the decoding state) and the q/k norms."""
        s = lbp.spec
        width, kv_width = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        kernel = declared(lbp.parts["attn"], lbp.kwargs("attn"), f"{at}.kernel",
                          "attention kernel", count, layers=layers)  # fmt: skip
        kv = 2 * s.num_kv_heads * s.head_dim * size  # a key and a value per token
        rows = [
            linear(f"{at}.q_proj", d, width, count, not shared, bias=s.qkv_bias, layers=layers),
            linear(f"{at}.k_proj", d, kv_width, count, False, bias=s.qkv_bias, layers=layers),
            linear(f"{at}.v_proj", d, kv_width, count, False, bias=s.qkv_bias, layers=layers),
            linear(f"{at}.output_proj", width, d, count, True, bias=s.out_bias, layers=layers),
            replace(kernel, state_each=(kv, 0)),
        ]
        if s.attn_gate:  # x is q_proj's input, kept there (or by the block, when shared)
            gate = linear(f"{at}.gate_proj", d, width, count, False, bias=s.qkv_bias, layers=layers)
            rows.insert(1, gate)
        if "qk_norm" in lbp.parts:
            full = s.qk_norm_scope == "full"
            for which, heads in (("q_norm", s.num_heads), ("k_norm", s.num_kv_heads)):
                kwargs = {**lbp.kwargs("qk_norm"), "d_model": s.head_dim * (heads if full else 1)}
                rows.append(
                    declared(
                        lbp.parts["qk_norm"],
                        kwargs,
                        f"{at}.{which}",
                        "norms",
                        count,
                        layers=layers,
                        rows=1 if full else heads,
                    )
                )
        if s.attn_gate or s.attn_sinks:
            # The attention's own: the sinks, and what the gate's sigmoid and product keep (the
            # gate and the heads' output; output_proj keeps the product). No matmul FLOPs.
            what = [w for w, on in (("sigmoid output gate", s.attn_gate),
                                    (f"sinks ({s.num_heads})", s.attn_sinks)) if on]  # fmt: skip
            params = s.num_heads if s.attn_sinks else 0
            kept = 2 * tokens * width * size if s.attn_gate else 0
            rows.append(Row(at, "attention projections", ", ".join(what), count, params, 0,
                            activations_each=kept, layers=layers))  # fmt: skip
        return rows

    def layer(lbp: Blueprint, prefix: str, layers: tuple[int, ...] | None) -> list[Row]:
        count = n_layers if layers is None else len(layers)
        block = lbp.parts["block"]
        shared = bool(block.entry.invoke("shared_input", lbp.kwargs("block")))
        attn: list[Row] = []
        for path in lbp.attention_paths():
            attn += attention(lbp, f"{prefix}.attn" + (f".{path}" if path else ""), count,
                              shared, layers)  # fmt: skip
        # The mixer's own row, after its attention rows (it claims what they leave), listed
        # when it holds, computes, keeps or carries anything (the attention mixer does not).
        own_mixer = declared(lbp.parts["mixer"], lbp.kwargs("mixer"), f"{prefix}.attn", "mixer",
                             count, layers=layers)  # fmt: skip
        if (
            own_mixer.params_each or own_mixer.flops_each or own_mixer.activations_each != 0
            or own_mixer.buffers_each != 0 or own_mixer.state_each != (0, 0)
        ):  # fmt: skip
            attn.append(own_mixer)
        ffn = [declared(lbp.parts["ffn"], lbp.kwargs("ffn"), f"{prefix}.ffn", "ffn", count,
                        layers=layers)]  # fmt: skip
        norms = {
            name: declared(lbp.parts["norm"], lbp.kwargs("norm"), f"{prefix}.{name}", "norms",
                           count, layers=layers)
            for name in lbp.norm_names()
        }  # fmt: skip

        # Rows in the order of the layer's modules, by the names' convention: ln1* belongs to
        # the attention, ln2* to the ffn, before it, or after it with `_out`; others at the end.
        def side(prefix_: str, out: bool) -> list[Row]:
            return [
                r for n, r in norms.items() if n.startswith(prefix_) and n.endswith("_out") == out
            ]

        ordered = [*side("ln1", False), *attn, *side("ln1", True), *side("ln2", False), *ffn,
                   *side("ln2", True)]  # fmt: skip
        ordered += [r for n, r in norms.items() if not n.startswith(("ln1", "ln2"))]
        own = declared(block, lbp.kwargs("block"), prefix, "block", count, layers=layers)
        if own.params_each or own.flops_each or own.activations_each != 0 or own.buffers_each != 0:
            ordered.append(own)
        return ordered

    lm_head = linear("lm_head", d, vocab, 1, saves_input=True)
    if spec.tie_embeddings:
        lm_head = replace(lm_head, module=f"{lm_head.module} (tied)", params_each=0)
    # A lookup, not a matmul: no FLOPs by the 2·m·n·p rule. Keeps the int64 token ids.
    rows = [Row("token_embeddings", "embeddings", f"embedding {vocab}×{d}", 1, vocab * d, 0,
                activations_each=8 * tokens)]  # fmt: skip
    # One instance per distinct encoding, applied once per forward, rotating in the layers it
    # serves (the model's `pos`, then `layer_pos.0`, ... in the order of their canonical spec).
    # Identical layers are counted once and multiplied (`Blueprint.groups`): the work does not
    # grow with num_layers.
    groups = bp.groups()
    variants = sorted({b.spec.pos for _, b in groups} - {spec.pos}, key=str)
    for j, pos in enumerate((spec.pos, *variants)):
        lbp = next((b for _, b in groups if b.spec.pos == pos), bp)
        # The attention sub-layers it rotates q and k in (a mixer without attention uses none).
        uses = sum(len(ls) * len(b.attention_paths()) for ls, b in groups if b.spec.pos == pos)
        name = "pos" if j == 0 else f"layer_pos.{j - 1}"
        rows.append(declared(lbp.parts["pos"], lbp.kwargs("pos"), name, "embeddings", 1, uses=uses))
    for layers, lbp in groups:
        if len(groups) == 1:
            rows += layer(lbp, "layers.*", None)
        else:
            rows += layer(lbp, f"layers[{format_layers(layers, n_layers)}]", tuple(layers))
    rows.append(declared(bp.parts["norm"], bp.kwargs("norm"), "ln_final", "norms", 1))
    rows.append(lm_head)
    if spec.logit_softcap:  # tanh keeps its output, the logits' size, in the model's dtype
        rows.append(Row("logit_cap", "lm_head", "cap·tanh(logits / cap)", 1, 0, 0,
                        activations_each=tokens * vocab * size))  # fmt: skip
    # cross_entropy keeps float32 logits, the log-partition per token, the int64 targets and
    # the bool mask of kept targets, and for the masked mean the int64 count and one bool.
    loss = tokens * (4 * vocab + 4 + 8 + 1) + 8 + 1
    return Accounting(blueprint=bp, batch=batch, seq_len=seq, dtype=dtype, rows=tuple(rows),
                      loss_activations=loss)  # fmt: skip


def _check_shape(spec: ModelSpec, batch: int, seq: int) -> None:
    if batch < 1:
        raise ModelInputError(f"batch size must be at least 1, got {batch}")
    if not 1 <= seq <= (ctx := spec.context_length):
        raise ModelInputError(
            f"sequence length {seq} does not fit context_length={ctx}; use 1..{ctx} "
            f"or raise context_length in the spec (e.g. '..., context_length={seq}')"
        )


# ---------------------------------------------------------------------- the size check

# torch indexes a tensor's bytes with a signed 64-bit integer.
MAX_TENSOR_BYTES: Final = 2**63 - 1
# Host memory the module objects of one layer take, whatever the device, meta included
# (measured: tinystories' layer, 13 modules and 9 parameters, takes 37 KiB on meta): a meta
# build of a million layers still needs ~36 GiB.
LAYER_OBJECT_BYTES: Final = 36 * 2**10
LAYER_MODULES: Final = 13
# What LAYER_MODULES counts for a slot: a gated FFN's four (the layer, w1, w2, w3), one for any
# other component; a component declaring more adds the difference.
_IN_LAYER_MODULES: Final = {"ffn": 4}
# Host memory of one module object beyond those (measured: a SwiGLU expert, four modules and
# three parameters, takes 15 KiB on meta), for a component that declares `modules`.
MODULE_OBJECT_BYTES: Final = 4 * 2**10
# The most module objects lmcore builds: Python builds about ten thousand a second, so a model
# of more takes minutes and gigabytes of host memory before its first forward, meta included
# (DeepSeek-V3's 61 layers of 256 experts are about 63,000).
MAX_MODULES: Final = 2**20


@dataclass(frozen=True)
class Footprint:
    """What building a blueprint allocates, from the declarations alone: per row, the weights
    (`lmcore.model.quant.weight_bytes`) and the declared buffers of all its modules."""

    accounting: Accounting

    @property
    def parts(self) -> dict[str, int]:
        weights = weight_bytes(self.accounting)
        return {r.name: weights[r.name] + (r.buffers or 0) for r in self.accounting.rows}

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.parts.items(), key=lambda item: item[1])

    @property
    def temporaries(self) -> tuple[str, int]:
        """The row whose one module's build allocates the most beyond what it keeps, and the
        bytes: modules are built one at a time, so the build's peak is `total` plus these."""
        row = max(self.accounting.rows, key=lambda r: r.temporaries_each)
        return row.name, row.temporaries_each

    @property
    def peak(self) -> int:
        """The most the build holds at once: the weights and buffers, and the temporaries of
        the module that allocates the most while it is built (RoPE's angles)."""
        return self.total + self.temporaries[1]

    @property
    def modules(self) -> int:
        """The module objects the build makes (an estimate: `LAYER_MODULES` per layer, plus
        what the components that declare `modules` build beyond one)."""
        return self.accounting.spec.num_layers * LAYER_MODULES + self._extra_modules()

    @property
    def host_bytes(self) -> int:
        """Host memory the module objects take, on any device (meta included)."""
        layers = self.accounting.spec.num_layers
        return layers * LAYER_OBJECT_BYTES + self._extra_modules() * MODULE_OBJECT_BYTES

    def _extra_modules(self) -> int:
        """The modules the components that declare `modules` build beyond what `LAYER_MODULES`
        already counts for their slot (never fewer: a smaller one is not subtracted)."""
        return sum(
            max(r.modules_each - _IN_LAYER_MODULES.get(r.entry.kind if r.entry else "", 1), 0)
            * r.count
            for r in self.accounting.rows
            if r.modules_each
        )

    def most_modules(self) -> Row:
        """The row whose modules make the most module objects."""
        return max(self.accounting.rows, key=lambda r: (r.modules_each or 1) * r.count)


def footprint(bp: Blueprint, dtype: torch.dtype) -> Footprint:
    """The bytes a build of `bp` in `dtype` allocates, by row; see `Footprint`."""
    return Footprint(account(bp, batch=1, seq_len=1, dtype=dtype))


def check_size(
    bp: Blueprint, *, device: torch.device, dtype: torch.dtype, max_bytes: int | None = None
) -> Footprint:
    """Refuse (`ModelTooLargeError`, naming the total and the largest part) a build whose
    weights and buffers exceed `max_bytes` (default: the memory available on `device`, none on
    meta), a module torch could not index, or more layers than the host can hold the module
    objects of. Nothing is allocated."""
    found = footprint(bp, dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    size = dtype.itemsize
    for row in found.accounting.rows:
        each = max(row.params_each * size, row.buffers_each or 0)
        if each > MAX_TENSOR_BYTES:
            raise ModelTooLargeError(
                f"{row.name} ({row.module}) would hold {format_bytes(each)} ({each:,} bytes) in "
                f"one {dtype_name} module, beyond the 2**63 - 1 bytes torch can index; shrink "
                f"the dimensions it is built for ({_dims_of(bp, row)})"
            )
    total, (name, largest) = found.total, found.largest
    limit, what = memory_limit(device, max_bytes)
    if limit is not None and total > limit:
        raise ModelTooLargeError(
            f"the model needs {format_bytes(total)} ({total:,} bytes) for its {dtype_name} "
            f"weights and buffers, more than {what}; the largest part is {name} "
            f"({format_bytes(largest)}){_fix(bp, name)}. Shrink the spec, or raise the limit "
            "with max_bytes= (--max-bytes on the command line)"
        )
    busy, extra = found.temporaries
    if limit is not None and device.type != "meta" and found.peak > limit:  # meta computes none
        peak = found.peak
        raise ModelTooLargeError(
            f"building the model peaks at {format_bytes(peak)} ({peak:,} bytes): its "
            f"{dtype_name} weights and buffers ({format_bytes(total)}) and, while {busy} is "
            f"built, {format_bytes(extra)} of temporaries its tables are computed from; more "
            f"than {what}{_fix(bp, busy)}. Shrink the spec, or raise the limit with "
            "max_bytes= (--max-bytes on the command line)"
        )
    _check_objects(bp, found)
    return found


def _fix(bp: Blueprint, row: str) -> str:
    """What sizes a table that grows with the context (`pos`'s), named for the message."""
    if row == "pos" or row.startswith("layer_pos."):
        return f", sized by context_length={bp.spec.context_length:,}: lower it"
    return ""


def _check_objects(bp: Blueprint, found: Footprint) -> None:
    """Refuse a build of more module objects than the host can hold, or than `MAX_MODULES`."""
    layers, modules, need = bp.spec.num_layers, found.modules, found.host_bytes
    row = found.most_modules()
    if row.modules_each and row.modules_each > LAYER_MODULES and row.entry is not None:
        args = ", ".join(
            f"{k}={v:,}" for k, v in row.kwargs if isinstance(v, int) and not isinstance(v, bool)
        )
        what = (
            f"{row.name} ({row.module}, {args}) is {row.modules_each:,} modules in each of "
            f"{row.count:,} layer{'s' if row.count > 1 else ''}; lower its arguments or "
            "num_layers"
        )
    else:
        what = f"num_layers={layers:,} (about {LAYER_MODULES} modules each); lower num_layers"
    host = available_memory(torch.device("cpu"))
    if host is not None and need > host:
        raise ModelTooLargeError(
            f"the model's {modules:,} module objects alone need about {format_bytes(need)} of "
            f"host memory (about {format_bytes(LAYER_OBJECT_BYTES)} per layer and "
            f"{format_bytes(MODULE_OBJECT_BYTES)} per module a component adds, on any device, "
            f"meta included), more than the {format_bytes(host)} available: {what}"
        )
    if modules > MAX_MODULES:
        raise ModelTooLargeError(
            f"the model would be {modules:,} module objects, more than the {MAX_MODULES:,} "
            f"lmcore builds (minutes of Python and {format_bytes(need)} of host memory on any "
            f"device, meta included): {what}"
        )


def _dims_of(bp: Blueprint, row: Row) -> str:
    if row.entry is not None:
        args = bp.kwargs(row.entry.kind).items()  # sizes with separators, words as given
        return ", ".join(f"{k}={v:,}" if type(v) is int else f"{k}={v}" for k, v in args)
    s = bp.spec
    return f"vocab_size={s.vocab_size:,}, d_model={s.d_model:,}"


def memory_limit(device: torch.device, max_bytes: int | None) -> tuple[int | None, str]:
    """The byte limit of a build and how to name it in a message."""
    if max_bytes is not None:
        return max_bytes, f"the limit max_bytes={max_bytes:,} ({format_bytes(max_bytes)})"
    available = None if device.type == "meta" else available_memory(device)
    if available is None:
        return None, ""
    return available, f"the {format_bytes(available)} of memory available on {device}"


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on `device`: for the CPU the kernel's MemAvailable
    (capped by a cgroup v2 limit), for CUDA the driver's free memory; None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0]) if torch.cuda.is_available() else None
    if device.type != "cpu":
        return None
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError):
        pass
    try:  # a container's own limit
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            cap = f.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
            used = int(f.read().strip())
        if cap != "max":
            found.append(max(0, int(cap) - used))
    except (OSError, ValueError):
        pass
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None


def format_bytes(n: int) -> str:
    """Binary prefixes, as memory is sized: 7.92 GiB."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30),
                        ("MiB", 2**20), ("KiB", 2**10)):  # fmt: skip
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
