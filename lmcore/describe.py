"""What `lmcore describe` shows: the declared sizes (`lmcore.model.counting`) checked against
a model built on the meta device, the activations measured when asked, and the training memory.

Activations (the bytes autograd keeps for backward) are declared by each component
(`Component.activations`), and lmcore adds what its own pieces and the loss save.
`measure_activations` finds the same numbers by running the forward and the loss on meta
tensors under `saved_tensors_hooks`, summing every distinct storage the graph still holds, row
by row; lmcore's tests hold every declaration to that measurement, byte for byte.

`describe(spec)` adds what needs the model's structure, built on the meta device (no storage):
a cross-check of every declared parameter count against the built modules, the bytes of
weights, gradients and AdamW state, and the activations. It measures them only when asked to, or
when a component declares none: the first operation on a meta tensor makes torch import its
compiler stack, about a second, several times what the rest of `describe` costs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

import torch
from torch import Tensor, nn

from lmcore.blueprint import Blueprint
from lmcore.errors import LmcoreError
from lmcore.model.adapters import adapters
from lmcore.model.counting import (
    Accounting,
    AccountingError,
    Footprint,
    Row,
    account,
)
from lmcore.model.nn import cross_entropy
from lmcore.model.quant import stored, weight_bytes
from lmcore.model.recompute import plan, targets
from lmcore.model.roles import ROLES, roles_of
from lmcore.model.transformer import TransformerLM, build_model
from lmcore.registry import Registry
from lmcore.spec import ModelSpec

ADAMW_STATE_BYTES: Final = 8  # two float32 moments per parameter
# The most module objects `describe` builds on meta to check the declarations against (a few
# seconds of Python); a model whose two layers hold more (a mixture of ten thousand experts) is
# described from its declarations alone, and says so.
PROBE_MODULES: Final = 2**15


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
    # An adapter's tensors (`lmcore.model.adapters`) are not the base's rows': counted apart.
    seen: set[int] = {id(t) for _, m in adapters(model)
                      for t in (m.buffers() if buffers else m.parameters())}  # fmt: skip
    # A stored matrix (`lmcore.model.quant`) counts as the parameters of its weight.
    formats = {id(m): m for _, m in stored(model)}
    out: dict[str, int] = {}
    for row in acc.rows:
        total = 0
        for path in row.paths(len(model.layers)):
            module = model.get_submodule(path)
            for sub in module.modules() if formats and not buffers else ():
                if id(sub) in formats and id(sub) not in seen:
                    seen.add(id(sub))
                    seen.update(id(t) for t in sub.parameters())
                    total += sub.in_features * sub.out_features
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
    stray = [n for n, p in model.named_parameters() if id(p) not in claimed]  # adapters claimed
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

    encodings = {"pos": model.pos, **{f"layer_pos.{j}": m for j, m in enumerate(model.layer_pos)}}
    for path, module in model.named_modules():
        if path in where and path not in encodings:
            handles.append(module.register_forward_pre_hook(enter(where[path])))
            handles.append(module.register_forward_hook(leave))

    def as_pos(fn: Callable[..., object], row: str) -> Callable[..., object]:
        def wrapped(*args: object, **kwargs: object) -> object:
            stack.append(row)
            try:
                out = fn(*args, **kwargs)
            finally:
                stack.pop()
            return as_pos(out, row) if callable(out) and not isinstance(out, Tensor) else out

        return wrapped

    hooks = ("embed", "rotation", "attention_bias")
    for row, pos in encodings.items():
        for name in hooks:  # instance attributes shadow the methods for this one run
            setattr(pos, name, as_pos(getattr(pos, name), where.get(row, row)))
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
        for pos in encodings.values():
            for name in hooks:
                delattr(pos, name)
    return {**{r.name: found.get(r.name, 0) for r in acc.rows},
            "loss": found.get("loss", 0), "other": found.get("other", 0)}  # fmt: skip


def by_part(acc: Accounting, by_row: dict[str, int]) -> dict[str, int]:
    """Activation bytes by row (as `measure_activations` or `declared_activations` give them)
    summed into the model's parts (`Accounting.parts()`) and `loss`, plus a part `other` when
    something was saved outside every row (lmcore's own code never does; the tests check it)."""
    parts = dict.fromkeys((*acc.parts(), "loss"), 0)
    for row in acc.rows:
        parts[row.part] += by_row.get(row.name, 0)
    parts["loss"] += by_row.get("loss", 0)
    if by_row.get("other"):
        parts["other"] = by_row["other"]
    return parts


def recomputed_activations(acc: Accounting, by_row: dict[str, int], recompute: str) -> int:
    """The activation bytes of a forward and backward whose parts `recompute` names are
    recomputed (`lmcore.model.recompute`), from the bytes each row saves (`by_row`, as
    `measure_activations` or `declared_activations` give them): every part keeps its input
    (batch × seq × d_model in the dtype) instead of what it saves, plus, at its backward, one
    part's saved bytes at a time, the largest:

        saved − Σ_parts saved(part) + parts × input + max_parts saved(part)

    An estimate of the peak as if nothing outside the layers was freed before their backward.
    `RecomputeError` for a value that is not the grammar or a mixer no layer has."""
    spec = acc.spec
    per_path = {
        path: by_row.get(r.name, 0) // max(r.count, 1)
        for r in acc.rows
        for path in r.paths(spec.num_layers)
    }
    attribute = {"layers": "", "mixer": ".attn", "ffn": ".ffn"}
    parts = []
    for i, target in plan(_mixers(acc), recompute):
        prefix = f"layers.{i}{attribute[target]}"
        parts.append(
            sum(n for p, n in per_path.items() if p == prefix or p.startswith(prefix + "."))
        )
    if not parts:
        return sum(by_row.values())
    kept_input = acc.batch * acc.seq_len * spec.d_model * acc.dtype.itemsize
    return sum(by_row.values()) - sum(parts) + len(parts) * kept_input + max(parts)


def _mixers(acc: Accounting) -> list[str]:
    """Each layer's token mixer, by name."""
    bp = acc.blueprint
    return [bp.layer(i).parts["mixer"].name for i in range(acc.spec.num_layers)]


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes to train with AdamW in `dtype` (weights, gradients and activations in `dtype`,
    AdamW's two moments in float32).

    `activations_source` says where the activations come from: "declared" (by the components,
    held to measurement by the tests) or "measured" (on the meta device). `activations` is None
    when they had to be measured and the forward could not run on the meta device; `note` says
    why, or why they were measured.

    The activations are one micro-batch's (`micro_batch` sequences; None: the whole batch),
    and with `recompute` (`lmcore.model.recompute`'s grammar) the estimate
    `recomputed_activations` gives; `activations_saved` and `activations_by_part` are then
    what the forward would save without it.
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
    micro_batch: int | None = None
    recompute: str | None = None
    activations_saved: int | None = None

    @property
    def total(self) -> int:
        fixed = self.weights + self.gradients + self.optimizer + self.buffers
        return fixed + (self.activations or 0)


@dataclass(frozen=True)
class RoleCount:
    """The parameters of one role (`lmcore.model.roles`): tensors and elements, a tied
    matrix once."""

    role: str
    tensors: int
    params: int


def role_counts(model: nn.Module, num_layers: int) -> tuple[RoleCount, ...]:
    """The parameters of `model` by role, in `ROLES`' order, scaled to `num_layers` identical
    layers when `model` was built with fewer (a probe of `describe`'s: its layer 0 counts for
    every layer)."""
    probe = len(getattr(model, "layers", ())) < num_layers
    params = dict(model.named_parameters())
    tensors: dict[str, int] = {}
    elements: dict[str, int] = {}
    for name, role in roles_of(model).items():
        scale = 1
        if probe and name.startswith("layers."):
            if not name.startswith("layers.0."):
                continue
            scale = num_layers
        tensors[role.name] = tensors.get(role.name, 0) + scale
        elements[role.name] = elements.get(role.name, 0) + scale * params[name].numel()
    return tuple(RoleCount(r, tensors[r], elements[r]) for r in ROLES if r in tensors)


@dataclass(frozen=True)
class Description:
    """Everything `lmcore describe` shows. `mismatches` lists rows whose declared activations
    differ from the measurement (only when `describe` measured and every row declares)."""

    accounting: Accounting
    memory: TrainingMemory
    mismatches: tuple[str, ...] = ()
    # Why the declarations were not checked against a meta-device build ("": they were).
    unchecked: str = ""
    # The parameters by role; none when the model was too large to build on meta.
    roles: tuple[RoleCount, ...] = ()


def describe(
    spec: Blueprint | ModelSpec | str,
    *,
    batch: int = 1,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    measure: bool = False,
    registry: Registry | None = None,
    micro_batch: int | None = None,
    recompute: str | None = None,
) -> Description:
    """Account `spec`, check the declarations against a meta-device build and estimate the
    training memory for `batch` sequences of `seq_len` (default: the context length).

    Activations come from the components' declarations; with `measure=True`, or when a
    component declares none, from a forward on the meta device instead. They are those of
    `micro_batch` sequences when the batch is accumulated in micro-batches (`--micro-batch`),
    and with `recompute` (`--recompute`) what `recomputed_activations` estimates.
    """
    if micro_batch is not None and (micro_batch < 1 or batch % micro_batch):
        raise LmcoreError(f"--micro-batch {micro_batch}: must be a divisor of --batch {batch}")
    acc = account(spec, batch=batch, seq_len=seq_len, dtype=dtype, registry=registry)
    if recompute is not None:  # RecomputeError for a value not the grammar, a mixer none has
        recompute = targets(recompute)
        plan(_mixers(acc), recompute)
    act = acc  # whose batch the activations are of: one micro-batch
    if micro_batch is not None and micro_batch != batch:
        act = account(acc.blueprint, batch=micro_batch, seq_len=seq_len, dtype=dtype)
    bp = acc.blueprint
    # Layers are identical, so at most two are built to check the declarations against: the
    # cost does not grow with num_layers (measuring activations builds them all). Layers that
    # differ are all built.
    probe = bp
    if not bp.spec.layers:
        probe = replace(bp, spec=replace(bp.spec, num_layers=min(bp.spec.num_layers, 2)))
    objects = Footprint(account(probe, batch=1, seq_len=1, dtype=dtype)).modules
    model: TransformerLM | None = None
    unchecked = ""
    if objects > PROBE_MODULES:
        unchecked = (
            f"the declarations were not checked against a meta-device build: "
            f"{probe.spec.num_layers} layer{'s' if probe.spec.num_layers > 1 else ''} of it "
            f"would be about {objects:,} module objects (describe builds at most "
            f"{PROBE_MODULES:,})"
        )
        built: dict[str, int] = {}
    else:
        model = build_model(probe, device="meta", dtype=dtype)
        check_params(acc, model)
        check_buffers(acc, model)
        built = measured_buffers(acc, model)  # for components that declare none

    def row_buffers(r: Row) -> int:
        if r.buffers is not None:
            return r.buffers
        if model is None:  # unknown without a build: left out, as `unchecked` says
            return 0
        return built[r.name] // r.instances(len(model.layers)) * r.count

    buffers = sum(row_buffers(r) for r in acc.rows)
    size = dtype.itemsize
    activations = act.activations
    by_row = act.declared_activations() if activations is not None else {}
    source, note = "declared", ""
    mismatches: tuple[str, ...] = ()
    if measure or activations is None:
        if activations is None:
            missing = act.undeclared_components()
            note = f"{' and '.join(missing)} declare{'s' if len(missing) == 1 else ''} none"
        full = (
            model
            if model is not None and probe.spec == bp.spec
            else build_model(bp, device="meta", dtype=dtype)
        )
        try:
            measured = measure_activations(act, full)
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
    saved: int | None = None
    if recompute is not None and source and by_row:
        saved, activations = activations, recomputed_activations(act, by_row, recompute)
    memory = TrainingMemory(
        dtype=str(dtype).removeprefix("torch."),
        weights=sum(weight_bytes(acc).values()),
        gradients=acc.params * size,
        optimizer=acc.params * ADAMW_STATE_BYTES,
        buffers=buffers,
        activations=activations if source else None,
        activations_by_part=by_part(act, by_row) if by_row else {},
        activations_source=source,
        note=note,
        micro_batch=micro_batch,
        recompute=recompute,
        activations_saved=saved,
    )
    if unchecked and any(r.buffers is None for r in acc.rows):
        unchecked += "; the buffers of components that declare none are left out"
    roles = role_counts(model, bp.spec.num_layers) if model is not None else ()
    return Description(
        accounting=acc, memory=memory, mismatches=mismatches, unchecked=unchecked, roles=roles
    )
