"""Parameter, FLOP and memory accounting from a spec, before any weight exists.

`account(spec)` adds up, row by row, what each component declares (`Component.params` and
`Component.flops`) and what lmcore knows about its own pieces: the token embeddings, the
q/k/v/output projections (k and v sized by `num_kv_heads`) and `lm_head`, whose matmuls are
counted here by the 2·m·n·p rule. Nothing is allocated.

`describe(spec)` adds what needs the model's structure, built on the meta device (no storage):
a cross-check of every declared parameter count against the built modules, the bytes of weights,
gradients and AdamW state, and the activations autograd saves for backward. Those are measured,
not guessed: the forward (and the loss) runs on meta tensors under `saved_tensors_hooks`, and the
bytes of every distinct storage still held by the graph are summed. That counts any component
exactly as it is written, with no per-component formula to keep in step with the code.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final

import torch
from torch import Tensor, nn

from lmcore.errors import LmcoreError, ModelInputError
from lmcore.model import TransformerLM, build_model
from lmcore.registry import Entry, Registry, get_registry
from lmcore.spec import ModelSpec, parse_spec
from lmcore.train import cross_entropy


class AccountingError(LmcoreError, ValueError):
    """A component's declared parameter count disagrees with the module it builds."""


# Rows are grouped into parts for the FLOPs breakdown, in this order.
PARTS: Final = (
    "embeddings",
    "norms",
    "attention projections",
    "attention kernel",
    "ffn",
    "lm_head",
)

ADAMW_STATE_BYTES: Final = 8  # two float32 moments per parameter


@dataclass(frozen=True)
class Row:
    """One module of the model, counted `count` times (once per layer for per-layer rows).

    `name` is the module's path, with `*` for the layer index (`layers.*.attn.q_proj`).
    `flops_each` is the forward matmul FLOPs of one instance for the whole batch.
    """

    name: str
    part: str
    module: str  # what sits there: "norm=rmsnorm", "linear 512->512", ...
    count: int
    params_each: int
    flops_each: int
    entry: Entry | None = None  # the plugin component, or None for lmcore's own pieces

    @property
    def params(self) -> int:
        return self.params_each * self.count

    @property
    def flops(self) -> int:
        return self.flops_each * self.count

    @property
    def per_layer(self) -> bool:
        return self.name.startswith("layers.*.")

    def paths(self, num_layers: int) -> Iterator[str]:
        """The module paths this row stands for in a built `TransformerLM`."""
        if self.per_layer:
            for i in range(num_layers):
                yield self.name.replace("*", str(i), 1)
        else:
            yield self.name


@dataclass(frozen=True)
class Accounting:
    """Parameters and forward FLOPs of a spec, by row, for `batch` sequences of `seq_len`."""

    spec: ModelSpec
    batch: int
    seq_len: int
    rows: tuple[Row, ...]

    @property
    def params(self) -> int:
        return sum(r.params for r in self.rows)

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def layer_params(self) -> int:
        return sum(r.params_each for r in self.rows if r.per_layer)

    @property
    def layer_flops(self) -> int:
        return sum(r.flops_each for r in self.rows if r.per_layer)

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r}; rows are {', '.join(r.name for r in self.rows)}")

    def params_share(self, row: Row) -> float:
        return row.params / self.params if self.params else 0.0

    def flops_share(self, row: Row) -> float:
        return row.flops / self.flops if self.flops else 0.0

    def flops_by_part(self) -> dict[str, int]:
        return {part: sum(r.flops for r in self.rows if r.part == part) for part in PARTS}


def account(
    spec: ModelSpec | str,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    registry: Registry | None = None,
) -> Accounting:
    """Count parameters and forward FLOPs from the declarations alone; `seq_len` defaults to
    the context length."""
    registry = registry or get_registry()
    spec = parse_spec(str(spec), registry)
    seq = spec.context_length if seq_len is None else seq_len
    _check_shape(spec, batch, seq)

    entries = {
        kind: registry.get(kind, spec.component(kind).name, spec.component(kind).provider)
        for kind in ("norm", "ffn", "pos", "attn")
    }

    def declared(kind: str, name: str, part: str, count: int) -> Row:
        entry = entries[kind]
        kwargs = {**spec.dims(kind), **spec.component(kind).kwargs}
        return Row(
            name=name,
            part=part,
            module=f"{kind}={entry.name}",
            count=count,
            params_each=entry.component.count_params(**kwargs),
            # Components declare FLOPs for one sequence; a plain forward has kv_len = seq_len.
            flops_each=batch * entry.component.count_flops(**kwargs, seq_len=seq, kv_len=seq),
            entry=entry,
        )

    def linear(name: str, part: str, d_in: int, d_out: int, count: int, params: bool = True) -> Row:
        return Row(
            name=name,
            part=part,
            module=f"linear {d_in}->{d_out}",
            count=count,
            params_each=d_in * d_out if params else 0,
            flops_each=2 * batch * seq * d_in * d_out,
        )

    d, layers, vocab = spec.d_model, spec.num_layers, spec.vocab_size
    kv_width = spec.num_kv_heads * spec.head_dim
    lm_head = linear("lm_head", "lm_head", d, vocab, 1, params=not spec.tie_embeddings)
    if spec.tie_embeddings:
        lm_head = replace(lm_head, module=f"{lm_head.module} (tied)")
    rows = (
        # A lookup, not a matmul: no FLOPs by the 2·m·n·p rule.
        Row("token_embeddings", "embeddings", f"embedding {vocab}×{d}", 1, vocab * d, 0),
        declared("pos", "pos", "embeddings", 1),  # one instance, applied once per forward
        declared("norm", "layers.*.ln1", "norms", layers),
        linear("layers.*.attn.q_proj", "attention projections", d, d, layers),
        linear("layers.*.attn.k_proj", "attention projections", d, kv_width, layers),
        linear("layers.*.attn.v_proj", "attention projections", d, kv_width, layers),
        linear("layers.*.attn.output_proj", "attention projections", d, d, layers),
        declared("attn", "layers.*.attn.kernel", "attention kernel", layers),
        declared("norm", "layers.*.ln2", "norms", layers),
        declared("ffn", "layers.*.ffn", "ffn", layers),
        declared("norm", "ln_final", "norms", 1),
        lm_head,
    )
    return Accounting(spec=spec, batch=batch, seq_len=seq, rows=rows)


def _check_shape(spec: ModelSpec, batch: int, seq: int) -> None:
    if batch < 1:
        raise ModelInputError(f"batch size must be at least 1, got {batch}")
    if not 1 <= seq <= spec.context_length:
        ctx = spec.context_length
        raise ModelInputError(
            f"sequence length {seq} does not fit context_length={ctx}; use 1..{ctx} "
            f"or raise context_length in the spec (e.g. '..., context_length={seq}')"
        )


# ---------------------------------------------------------------------- the built model


def measured_params(acc: Accounting, model: TransformerLM) -> dict[str, int]:
    """Parameters each row's modules actually hold, each shared tensor counted once, at its
    first row (so tied embeddings count under `token_embeddings`)."""
    return _claim(acc, model)[0]


def _claim(acc: Accounting, model: TransformerLM) -> tuple[dict[str, int], set[int]]:
    """Per-row parameter counts, and the ids of the parameters the rows claimed."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for row in acc.rows:
        total = 0
        for path in row.paths(acc.spec.num_layers):
            for p in model.get_submodule(path).parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        out[row.name] = total
    return out, seen


def check_params(acc: Accounting, model: TransformerLM) -> None:
    """Raise `AccountingError`, naming the component, where a declared count differs from the
    built module's, or where the model holds parameters no row accounts for."""
    actual, claimed = _claim(acc, model)
    for row in acc.rows:
        if actual[row.name] == row.params:
            continue
        each = actual[row.name] // row.count
        if row.entry is None:
            raise AccountingError(
                f"{row.name}: lmcore counts {row.params_each:,} parameters for its {row.module} "
                f"but the built module holds {each:,}; this is a bug in lmcore, please report it"
            )
        kind, name = row.entry.kind, row.entry.name
        given = {**acc.spec.dims(kind), **acc.spec.component(kind).kwargs}
        shape = ", ".join(f"{k}={v}" for k, v in given.items())
        raise AccountingError(
            f"{row.name}: {kind} {name!r} from {row.entry.provenance} declares "
            f"{row.params_each:,} parameters for {shape}, but the module it builds holds "
            f"{each:,}; fix the params= declaration of {kind} {name!r}"
        )
    stray = [n for n, p in model.named_parameters() if id(p) not in claimed]
    if stray:
        raise AccountingError(
            f"the built model holds parameters outside the accounted modules ({', '.join(stray)}); "
            "this is a bug in lmcore's accounting, please report it"
        )


class _Saved:
    """What the pack hook hands autograd: a detached alias of the saved tensor, in a box that
    dies with the graph node holding it. Detaching matters: an op's saved *output* arrives with
    its own grad_fn, and boxing it as is would tie node and tensor in a cycle that keeps both
    alive, so a node dropped mid-forward (e.g. behind a `.detach()`) would still be counted."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: Tensor):
        self.tensor = tensor


def saved_activation_bytes(model: nn.Module, run: Callable[[], Tensor]) -> int:
    """Bytes of the distinct storages autograd keeps for backward after `run()` (a forward and
    loss of `model`), excluding the model's parameters and buffers.

    Runs on any device; on meta tensors it costs no memory and almost no time.
    """
    # Storages are told apart by their C++ object: data_ptr() is 0 for every meta tensor.
    held = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    boxes: list[weakref.ref[_Saved]] = []

    def pack(t: Tensor) -> _Saved:
        box = _Saved(t.detach())
        boxes.append(weakref.ref(box))
        return box

    def unpack(box: _Saved) -> Tensor:
        return box.tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = run()
    # Only the boxes the graph (kept alive by `out`) still holds count; views share a storage.
    storages: dict[int, int] = {}
    for ref in boxes:
        box = ref()
        if box is not None:
            storage = box.tensor.untyped_storage()
            if storage._cdata not in held:
                storages[storage._cdata] = storage.nbytes()
    del out
    return sum(storages.values())


def activation_bytes(model: TransformerLM, batch: int, seq_len: int) -> int:
    """Activations saved for backward by a forward plus next-token cross-entropy, measured on
    the model's own device (use a meta model to measure without allocating)."""
    device = next(model.parameters()).device
    inputs = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    targets = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    return saved_activation_bytes(model, lambda: cross_entropy(model(inputs), targets))


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes to train with AdamW in `dtype` (weights, gradients and activations in `dtype`,
    AdamW's two moments in float32). `activations` is None when the forward could not run on
    the meta device; `note` says why."""

    dtype: str
    weights: int
    gradients: int
    optimizer: int
    buffers: int
    activations: int | None
    note: str = ""

    @property
    def total(self) -> int:
        fixed = self.weights + self.gradients + self.optimizer + self.buffers
        return fixed + (self.activations or 0)


@dataclass(frozen=True)
class Description:
    """Everything `lmcore describe` shows."""

    accounting: Accounting
    memory: TrainingMemory


def describe(
    spec: ModelSpec | str,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    registry: Registry | None = None,
) -> Description:
    """Account `spec`, check the declarations against a meta-device build and estimate the
    training memory for `batch` sequences of `seq_len` (default: the context length)."""
    acc = account(spec, batch=batch, seq_len=seq_len, registry=registry)
    model = build_model(acc.spec, device="meta", dtype=dtype, registry=registry)
    check_params(acc, model)
    size = dtype.itemsize
    note = ""
    try:
        activations: int | None = activation_bytes(model, acc.batch, acc.seq_len)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        activations = None
        note = f"the forward does not run on the meta device ({type(e).__name__}: {e})"
    memory = TrainingMemory(
        dtype=str(dtype).removeprefix("torch."),
        weights=acc.params * size,
        gradients=acc.params * size,
        optimizer=acc.params * ADAMW_STATE_BYTES,
        buffers=sum(b.numel() * b.element_size() for b in model.buffers()),
        activations=activations,
        note=note,
    )
    return Description(accounting=acc, memory=memory)
