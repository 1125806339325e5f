"""Parameter, FLOP and memory accounting from a spec, before any weight exists.

`account(spec)` adds up, row by row, what each component declares (`Component.params` and
`Component.flops`) and what lmcore knows about its own pieces: the token embeddings, the
q/k/v/output projections (k and v sized by `num_kv_heads`) and `lm_head`, whose matmuls are
counted here by the 2·m·n·p rule. Nothing is allocated.

Activations (the bytes autograd keeps for backward) come the same way: each component declares
what its forward saves (`Component.activations`) and lmcore adds what its own pieces and the
loss save. `measure_activations` finds the same numbers by running the forward and the loss on
meta tensors under `saved_tensors_hooks`, summing every distinct storage the graph still holds,
row by row; lmcore's tests hold every declaration to that measurement, byte for byte.

`describe(spec)` adds what needs the model's structure, built on the meta device (no storage):
a cross-check of every declared parameter count against the built modules, the bytes of
weights, gradients and AdamW state, and the activations. It measures them only when asked to, or
when a component declares none: the first operation on a meta tensor makes torch import its
compiler stack, about a second, several times what the rest of `describe` costs.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Final

import torch
from torch import Tensor, nn

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import LmcoreError, LmcoreKeyError, ModelInputError, ModelTooLargeError
from lmcore.model import TransformerLM, build_model
from lmcore.registry import Entry, Registry
from lmcore.spec import ModelSpec
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
ACTIVATION_PARTS: Final = (*PARTS, "loss")

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
    # Bytes one instance saves for backward for the whole batch; None: the component declares none.
    activations_each: int | None = 0
    # Bytes of the buffers one instance holds; None: the component declares none.
    buffers_each: int | None = 0

    @property
    def params(self) -> int:
        return self.params_each * self.count

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
        return self.name.startswith("layers.*.")

    def instances(self, num_layers: int) -> int:
        """How many modules this row stands for in a model of `num_layers` layers."""
        return num_layers if self.per_layer else 1

    def paths(self, num_layers: int) -> Iterator[str]:
        """The module paths this row stands for in a built `TransformerLM`."""
        if self.per_layer:
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
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def layer_params(self) -> int:
        return sum(r.params_each for r in self.rows if r.per_layer)

    @property
    def layer_flops(self) -> int:
        return sum(r.flops_each for r in self.rows if r.per_layer)

    @property
    def undeclared(self) -> tuple[Row, ...]:
        """Rows whose component declares no activations."""
        return tuple(r for r in self.rows if r.activations_each is None)

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

    def flops_by_part(self) -> dict[str, int]:
        return {part: sum(r.flops for r in self.rows if r.part == part) for part in PARTS}


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
    bp = resolve(spec, registry)
    spec = bp.spec
    seq = spec.context_length if seq_len is None else seq_len
    _check_shape(spec, batch, seq)

    d, layers, vocab = spec.d_model, spec.num_layers, spec.vocab_size
    tokens, size = batch * seq, dtype.itemsize

    def declared(kind: str, name: str, part: str, count: int) -> Row:
        entry, kwargs = bp.entries[kind], bp.kwargs(kind)
        # Components declare FLOPs for one sequence; a plain forward has kv_len = seq_len.
        flops = entry.count("flops", {**kwargs, "seq_len": seq, "kv_len": seq})
        return Row(
            name=name,
            part=part,
            module=f"{kind}={entry.name}",
            count=count,
            params_each=entry.count("params", kwargs) or 0,
            flops_each=batch * (flops or 0),
            entry=entry,
            activations_each=entry.count(
                "activations", activation_kwargs(bp, kind, batch=batch, seq_len=seq, dtype=dtype)
            ),
            buffers_each=entry.count("buffers", {**kwargs, "dtype": dtype}),
        )

    def linear(name: str, d_in: int, d_out: int, count: int, saves_input: bool) -> Row:
        return Row(
            name=name,
            part="lm_head" if name == "lm_head" else "attention projections",
            module=f"linear {d_in}->{d_out}",
            count=count,
            params_each=d_in * d_out,
            flops_each=2 * tokens * d_in * d_out,
            # x @ W.T keeps x for W's gradient; q, k and v share theirs, counted at q_proj.
            activations_each=tokens * d_in * size if saves_input else 0,
        )

    kv_width = spec.num_kv_heads * spec.head_dim
    lm_head = linear("lm_head", d, vocab, 1, saves_input=True)
    if spec.tie_embeddings:
        lm_head = replace(lm_head, module=f"{lm_head.module} (tied)", params_each=0)
    rows = (
        # A lookup, not a matmul: no FLOPs by the 2·m·n·p rule. Keeps the int64 token ids.
        Row("token_embeddings", "embeddings", f"embedding {vocab}×{d}", 1, vocab * d, 0,
            activations_each=8 * tokens),
        declared("pos", "pos", "embeddings", 1),  # one instance, applied once per forward
        declared("norm", "layers.*.ln1", "norms", layers),
        linear("layers.*.attn.q_proj", d, d, layers, saves_input=True),
        linear("layers.*.attn.k_proj", d, kv_width, layers, saves_input=False),
        linear("layers.*.attn.v_proj", d, kv_width, layers, saves_input=False),
        linear("layers.*.attn.output_proj", d, d, layers, saves_input=True),
        declared("attn", "layers.*.attn.kernel", "attention kernel", layers),
        declared("norm", "layers.*.ln2", "norms", layers),
        declared("ffn", "layers.*.ffn", "ffn", layers),
        declared("norm", "ln_final", "norms", 1),
        lm_head,
    )  # fmt: skip
    # cross_entropy keeps float32 logits, the log-partition per token and the int64 targets.
    loss = tokens * (4 * vocab + 4 + 8)
    return Accounting(blueprint=bp, batch=batch, seq_len=seq, dtype=dtype, rows=rows,
                      loss_activations=loss)  # fmt: skip


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
    """Parameters each row's modules actually hold in `model`, each shared tensor counted once,
    at its first row (so tied embeddings count under `token_embeddings`)."""
    return _claim(acc, model)[0]


def measured_buffers(acc: Accounting, model: TransformerLM) -> dict[str, int]:
    """Bytes of the buffers each row's modules hold in `model` (each tensor counted once)."""
    return _claim(acc, model, buffers=True)[0]


def _claim(
    acc: Accounting, model: TransformerLM, *, buffers: bool = False
) -> tuple[dict[str, int], set[int]]:
    """Per-row parameter counts (or buffer bytes), and the ids of the tensors the rows claimed.
    `model` may have fewer layers than the spec (`describe` builds at most two)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for row in acc.rows:
        total = 0
        for path in row.paths(len(model.layers)):
            module = model.get_submodule(path)
            for t in module.buffers() if buffers else module.parameters():
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size() if buffers else t.numel()
        out[row.name] = total
    return out, seen


def check_params(acc: Accounting, model: TransformerLM) -> None:
    """Raise `AccountingError`, naming the component, where a declared count differs from the
    built module's, or where the model holds parameters no row accounts for. `model` may have
    fewer layers than the spec: each of its modules is compared with its row."""
    actual, claimed = _claim(acc, model)
    for row in acc.rows:
        instances = row.instances(len(model.layers))
        if actual[row.name] == row.params_each * instances:
            continue
        each = actual[row.name] // instances
        if row.entry is None:
            raise AccountingError(
                f"{row.name}: lmcore counts {row.params_each:,} parameters for its {row.module} "
                f"but the built module holds {each:,}; this is a bug in lmcore, please report it"
            )
        kind, name = row.entry.kind, row.entry.name
        given = acc.blueprint.kwargs(kind)
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


def check_buffers(acc: Accounting, model: TransformerLM) -> None:
    """Raise `AccountingError`, naming the component, where its declared buffer bytes differ
    from what the module it builds holds (components that declare none are skipped)."""
    actual = measured_buffers(acc, model)
    for row in acc.rows:
        instances = row.instances(len(model.layers))
        if row.buffers_each is None or actual[row.name] == row.buffers_each * instances:
            continue
        each = actual[row.name] // instances
        if row.entry is None:
            raise AccountingError(
                f"{row.name}: its {row.module} holds {each:,} bytes of buffers where lmcore "
                "counts none; this is a bug in lmcore, please report it"
            )
        kind, name = row.entry.kind, row.entry.name
        raise AccountingError(
            f"{row.name}: {kind} {name!r} from {row.entry.provenance} declares "
            f"{row.buffers_each:,} bytes of buffers in {acc.dtype}, but the module it builds "
            f"holds {each:,}; fix the buffers= declaration of {kind} {name!r}"
        )


# ---------------------------------------------------------------------- the size check

# torch indexes a tensor's bytes with a signed 64-bit integer.
MAX_TENSOR_BYTES: Final = 2**63 - 1
# Host memory the module objects of one layer take, whatever the device (measured for the
# built-in components at about 30-45 KiB): a meta build of a million layers still needs ~30 GiB.
LAYER_OBJECT_BYTES: Final = 32 * 2**10


@dataclass(frozen=True)
class Footprint:
    """What building a blueprint allocates, from the declarations alone: per row, the weights
    (parameters × the dtype's size) and the declared buffers of all its modules."""

    accounting: Accounting

    @property
    def parts(self) -> dict[str, int]:
        size = self.accounting.dtype.itemsize
        return {r.name: r.params * size + (r.buffers or 0) for r in self.accounting.rows}

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.parts.items(), key=lambda item: item[1])


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
            f"({format_bytes(largest)}). Shrink the spec, or raise the limit with "
            "max_bytes= (--max-bytes on the command line)"
        )
    layers = bp.spec.num_layers
    host = available_memory(torch.device("cpu"))
    if host is not None and layers * LAYER_OBJECT_BYTES > host:
        raise ModelTooLargeError(
            f"num_layers={layers:,}: the module objects alone need about "
            f"{format_bytes(layers * LAYER_OBJECT_BYTES)} of host memory (about "
            f"{format_bytes(LAYER_OBJECT_BYTES)} per layer, on any device, meta included), "
            f"more than the {format_bytes(host)} available; lower num_layers"
        )
    return found


def _dims_of(bp: Blueprint, row: Row) -> str:
    if row.entry is not None:
        return ", ".join(f"{k}={v:,}" for k, v in bp.kwargs(row.entry.kind).items())
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


class _Saved:
    """What the pack hook hands autograd: a detached alias of the saved tensor, in a box that
    dies with the graph node holding it. Detaching matters: an op's saved *output* arrives with
    its own grad_fn, and boxing it as is would tie node and tensor in a cycle that keeps both
    alive, so a node dropped mid-forward (e.g. behind a `.detach()`) would still be counted."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: Tensor):
        self.tensor = tensor


def saved_bytes_by_label(
    model: nn.Module, run: Callable[[], Tensor], label: Callable[[], str]
) -> dict[str, int]:
    """Bytes of the distinct storages autograd keeps for backward after `run()` (a forward and
    loss of `model`), excluding the model's parameters and buffers, grouped by `label()` as it
    was when each storage was first saved.

    Runs on any device; on meta tensors it costs no memory.
    """
    # Storages are told apart by their C++ object: data_ptr() is 0 for every meta tensor.
    held = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
    boxes: list[tuple[weakref.ref[_Saved], str]] = []

    def pack(t: Tensor) -> _Saved:
        box = _Saved(t.detach())
        boxes.append((weakref.ref(box), label()))
        return box

    def unpack(box: _Saved) -> Tensor:
        return box.tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = run()
    # Only the boxes the graph (kept alive by `out`) still holds count; views share a storage.
    first: dict[int, tuple[str, int]] = {}
    for ref, name in boxes:
        box = ref()
        if box is not None:
            storage = box.tensor.untyped_storage()
            if storage._cdata not in held and storage._cdata not in first:
                first[storage._cdata] = (name, storage.nbytes())
    del out
    by_label: dict[str, int] = {}
    for name, nbytes in first.values():
        by_label[name] = by_label.get(name, 0) + nbytes
    return by_label


def saved_activation_bytes(model: nn.Module, run: Callable[[], Tensor]) -> int:
    """The total of `saved_bytes_by_label`: every storage autograd keeps after `run()`."""
    return sum(saved_bytes_by_label(model, run, lambda: "").values())


def activation_bytes(model: TransformerLM, batch: int, seq_len: int) -> int:
    """Activations saved for backward by a forward plus next-token cross-entropy, measured on
    the model's own device (use a meta model to measure without allocating)."""
    device = next(model.parameters()).device
    inputs = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    targets = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
    return saved_activation_bytes(model, lambda: cross_entropy(model(inputs), targets))


def measure_activations(acc: Accounting, model: TransformerLM) -> dict[str, int]:
    """Activation bytes of forward + loss by row name (plus `loss`, and `other` for anything
    saved outside every row), measured by running `model` (built for `acc.spec`; use the meta
    device) on `acc.batch` × `acc.seq_len` tokens.

    A storage saved by two rows counts once, at the row that saved it first. The pos
    component's `embed`, `rotation` (and the function it returns) and `attention_bias` are
    attributed to the `pos` row wherever they run.
    """
    where = {path: row.name for row in acc.rows for path in row.paths(acc.spec.num_layers)}
    stack = ["other"]
    handles = []

    def enter(name: str) -> Callable[..., None]:
        return lambda *_: stack.append(name)

    def leave(*_: object) -> None:
        stack.pop()

    for path, module in model.named_modules():
        if path in where and path != "pos":
            handles.append(module.register_forward_pre_hook(enter(where[path])))
            handles.append(module.register_forward_hook(leave))

    def as_pos(fn: Callable[..., object]) -> Callable[..., object]:
        def wrapped(*args: object, **kwargs: object) -> object:
            stack.append("pos")
            try:
                out = fn(*args, **kwargs)
            finally:
                stack.pop()
            return as_pos(out) if callable(out) and not isinstance(out, Tensor) else out

        return wrapped

    pos = model.pos
    hooks = ("embed", "rotation", "attention_bias")
    for name in hooks:  # instance attributes shadow the methods for this one run
        setattr(pos, name, as_pos(getattr(pos, name)))
    device = next(model.parameters()).device
    shape = (acc.batch, acc.seq_len)
    inputs = torch.zeros(shape, dtype=torch.long, device=device)
    targets = torch.zeros(shape, dtype=torch.long, device=device)

    def run() -> Tensor:
        logits = model(inputs)
        stack.append("loss")
        return cross_entropy(logits, targets)

    try:
        found = saved_bytes_by_label(model, run, lambda: stack[-1])
    finally:
        for h in handles:
            h.remove()
        for name in hooks:
            delattr(pos, name)
    return {**{r.name: found.get(r.name, 0) for r in acc.rows},
            "loss": found.get("loss", 0), "other": found.get("other", 0)}  # fmt: skip


def by_part(acc: Accounting, by_row: dict[str, int]) -> dict[str, int]:
    """Activation bytes by row (as `measure_activations` or `declared_activations` give them)
    summed into `ACTIVATION_PARTS`, plus a part `other` when something was saved outside every
    row (lmcore's own code never does; the tests check it)."""
    parts = dict.fromkeys(ACTIVATION_PARTS, 0)
    for row in acc.rows:
        parts[row.part] += by_row.get(row.name, 0)
    parts["loss"] += by_row.get("loss", 0)
    if by_row.get("other"):
        parts["other"] = by_row["other"]
    return parts


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes to train with AdamW in `dtype` (weights, gradients and activations in `dtype`,
    AdamW's two moments in float32).

    `activations_source` says where the activations come from: "declared" (by the components,
    held to measurement by the tests) or "measured" (on the meta device). `activations` is None
    when they had to be measured and the forward could not run on the meta device; `note` says
    why, or why they were measured.
    """

    dtype: str
    weights: int
    gradients: int
    optimizer: int
    buffers: int
    activations: int | None
    activations_by_part: dict[str, int]
    activations_source: str
    note: str = ""

    @property
    def total(self) -> int:
        fixed = self.weights + self.gradients + self.optimizer + self.buffers
        return fixed + (self.activations or 0)


@dataclass(frozen=True)
class Description:
    """Everything `lmcore describe` shows. `mismatches` lists rows whose declared activations
    differ from the measurement (only when `describe` measured and every row declares)."""

    accounting: Accounting
    memory: TrainingMemory
    mismatches: tuple[str, ...] = ()


def describe(
    spec: Blueprint | ModelSpec | str,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    measure: bool = False,
    registry: Registry | None = None,
) -> Description:
    """Account `spec`, check the declarations against a meta-device build and estimate the
    training memory for `batch` sequences of `seq_len` (default: the context length).

    Activations come from the components' declarations; with `measure=True`, or when a
    component declares none, from a forward on the meta device instead.
    """
    acc = account(spec, batch=batch, seq_len=seq_len, dtype=dtype, registry=registry)
    bp = acc.blueprint
    # Layers are identical, so at most two are built to check the declarations against: the
    # cost does not grow with num_layers (measuring activations builds them all).
    probe = replace(bp, spec=replace(bp.spec, num_layers=min(bp.spec.num_layers, 2)))
    model = build_model(probe, device="meta", dtype=dtype)
    check_params(acc, model)
    check_buffers(acc, model)
    built = measured_buffers(acc, model)  # for components that declare none

    def row_buffers(r: Row) -> int:
        if r.buffers is not None:
            return r.buffers
        return built[r.name] // r.instances(len(model.layers)) * r.count

    buffers = sum(row_buffers(r) for r in acc.rows)
    size = dtype.itemsize
    activations = acc.activations
    by_row = acc.declared_activations() if activations is not None else {}
    source, note = "declared", ""
    mismatches: tuple[str, ...] = ()
    if measure or activations is None:
        if activations is None:
            missing = acc.undeclared_components()
            note = f"{' and '.join(missing)} declare{'s' if len(missing) == 1 else ''} none"
        full = build_model(bp, device="meta", dtype=dtype) if probe.spec != bp.spec else model
        try:
            measured = measure_activations(acc, full)
        except LmcoreError:
            raise  # a plugin's fault (e.g. an output of the wrong shape), named: not a note
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
            why = f"the forward does not run on the meta device ({type(e).__name__}: {e})"
            if activations is None:
                source, note, by_row = "", f"{note}, and {why}", {}
            else:
                note = f"not measured: {why}; showing the declared bytes"
        else:
            if activations is not None:
                mismatches = tuple(
                    f"{name}: declared {by_row.get(name, 0):,} bytes, measured {n:,}"
                    for name, n in measured.items()
                    if by_row.get(name, 0) != n
                )
            activations, by_row, source = sum(measured.values()), measured, "measured"
    memory = TrainingMemory(
        dtype=str(dtype).removeprefix("torch."),
        weights=acc.params * size,
        gradients=acc.params * size,
        optimizer=acc.params * ADAMW_STATE_BYTES,
        buffers=buffers,
        activations=activations if source else None,
        activations_by_part=by_part(acc, by_row) if by_row else {},
        activations_source=source,
        note=note,
    )
    return Description(accounting=acc, memory=memory, mismatches=mismatches)
