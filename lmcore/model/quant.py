"""Quantized weights: a model's matrices stored in a weight format (`quant=...`).

A spec names one with its `quant` key (``tinystories, quant=int8``, ``quant=q4_1(embedding=
q8_0)``; `none`, the default, keeps the matrices in the model's dtype and its canonical string
unchanged). After the model is assembled, `apply_quant` gives every `Linear` whose weight is a
hidden matrix, a packed one or the head, and the token `Embedding`, a `quant` child built by
the format's factory for that matrix (`in_features`, `out_features`, `role`); the weight
parameter is removed (its place in the state dict taken by the child's tensors,
``….quant.codes``, ``….quant.scales``, ...; `weight` stays, an empty non-persistent buffer of
the model's dtype and device, for code that asks a module for them), and `Linear` and
`Embedding` go through the child (`lmcore.model.nn`). A tied head shares the embedding's
child. Everything else (norm gains, biases, routers, convolutions) keeps the model's dtype.

The format's `stored` declaration gives the bytes each stored matrix holds: `weight_bytes`
counts them for `describe` and the size check, before anything is built. `quantize` turns a
float model's weights into a quantized one (`lmcore.quantizing`, `lmcore quantize`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import torch
from torch import nn

from lmcore.errors import PluginError, SpecError
from lmcore.model.nn import Embedding, Linear
from lmcore.parts import Part

__all__ = [
    "ATTR", "TARGET_ROLES", "apply_quant", "module_bytes", "quantize_from", "quantized",
    "row_bytes", "stored", "targets", "weight_bytes",
]  # fmt: skip

ATTR: Final = "quant"  # the child of each stored Linear / Embedding holding its format
# The roles of the matrices a weight format stores (the embedding: its table).
TARGET_ROLES: Final = ("matrix", "packed", "head", "embedding")


def targets(model: nn.Module) -> list[tuple[str, Any, str]]:
    """`(name, module, role)` of every Linear and Embedding a format stores, in model order,
    each shared weight once (a tied head is the embedding's)."""
    seen: set[int] = set()
    out = []
    for name, m in model.named_modules():
        if isinstance(m, Embedding):
            role = "embedding"
        elif isinstance(m, Linear):
            role = m.role.name
            if name == "lm_head":
                role = "head"
        else:
            continue
        w = m.weight
        if ATTR in m._modules or role not in TARGET_ROLES or id(w) in seen:
            continue
        seen.add(id(w))
        out.append((name, m, role))
    return out


def _tied(model: nn.Module) -> dict[str, str]:
    """Modules whose weight is another's: alias -> owner (the tied head -> the embedding)."""
    first: dict[int, str] = {}
    out = {}
    for name, m in model.named_modules():
        w = getattr(m, "weight", None) if isinstance(m, Linear | Embedding) else None
        if w is None:
            continue
        if id(w) in first:
            out[name] = first[id(w)]
        else:
            first[id(w)] = name
    return out


def apply_quant(model: nn.Module, part: Part, *, device: Any = None) -> list[str]:
    """Store the model's matrices in the format `part` names (in place); returns the stored
    modules' names. Each child starts empty (zeros): a checkpoint's tensors fill it, or
    `quantize_from` a float model's weights. A matrix the format cannot hold (rows not in
    blocks of 32) is a `SpecError` naming it."""
    aliases = _tied(model)
    built: dict[str, nn.Module] = {}
    for name, m, role in targets(model):
        n, k = m.weight.shape
        dims = {"in_features": k, "out_features": n, "role": role}
        on = device if device is not None else m.weight.device
        try:
            child = part.create(**dims, device=on)
        except PluginError as e:  # the format's own sentence, when it refuses this shape
            if not isinstance(e.__cause__, ValueError):
                raise
            raise SpecError(f"quant={part.spec}: {name}.weight ({n} x {k}): {e.__cause__}"
                            ) from None  # fmt: skip
        _swap(m, child, device)
        built[name] = child
    for alias, owner in aliases.items():
        _swap(model.get_submodule(alias), built[owner], device)
    return list(built)


def _swap(m: nn.Module, child: nn.Module, device: Any) -> None:
    """`m`'s weight parameter replaced by `child`; `weight` becomes an empty buffer of its
    dtype on the model's `device` (not on meta where the parameter waited to be loaded)."""
    w: torch.Tensor = m.weight  # type: ignore[assignment]
    del m.weight
    empty = torch.empty(0, dtype=w.dtype, device=device if device is not None else "cpu")
    m.register_buffer("weight", empty, persistent=False)
    setattr(m, ATTR, child)


def stored(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """`(name of the stored Linear / Embedding, its format's module)`, each once."""
    seen: set[int] = set()
    for name, m in model.named_modules():
        child = getattr(m, ATTR, None) if isinstance(m, Linear | Embedding) else None
        if isinstance(child, nn.Module) and id(child) not in seen:
            seen.add(id(child))
            yield name, child


def quantized(model: nn.Module) -> bool:
    """Whether `model` stores its matrices in a weight format."""
    return next(stored(model), None) is not None


def quantize_from(model: nn.Module, source: nn.Module) -> None:
    """Fill the quantized `model`'s formats from the float `source` (the same spec without
    `quant`): each stored matrix rounded as its format does; every other tensor copied (and
    assigned: `model`'s parameters may wait on the meta device)."""
    weights = dict(source.named_parameters(remove_duplicate=False))
    for name, child in stored(model):
        child.quantize_(weights[f"{name}.weight"])  # type: ignore[operator]
    own = model.state_dict()
    rest = {k: v.detach().clone() for k, v in source.state_dict().items() if k in own}
    missing = [k for k in own if k not in rest and ".quant." not in f".{k}"]
    if missing:
        raise SpecError(f"the float model has no {missing[0]} for the quantized one")
    model.load_state_dict(rest, strict=False, assign=True)  # its parameters may wait on meta


def _stored(part: Part, k: int, n: int, role: str) -> int:
    """Bytes the format `part` keeps for one `n` x `k` matrix of `role` (its declaration)."""
    found = part.entry.count("stored", {"in_features": k, "out_features": n, "role": role,
                                         **part.kwargs()})  # fmt: skip
    if found is None:
        raise PluginError(f"quant {part.name!r} from {part.provenance}: it declares no stored= "
                          "bytes; a weight format says what one stored matrix holds")  # fmt: skip
    return found


def module_bytes(part: Part, module: nn.Module, dtype: torch.dtype) -> int:
    """Bytes `module` (built, e.g. on meta) holds once its matrices are stored in `part`'s
    format: each targeted matrix as the format declares it, every other parameter in `dtype`."""
    total = 0
    done: set[int] = set()
    for _, m, role in targets(module):
        n, k = m.weight.shape
        total += _stored(part, k, n, role)
        done.add(id(m.weight))
    for p in module.parameters():
        if id(p) not in done:
            total += p.numel() * dtype.itemsize
    return total


def row_bytes(bp: Any, row: Any, dtype: torch.dtype, cache: dict[Any, int] | None = None
              ) -> int:  # fmt: skip
    """The weight bytes of one instance of `row` (`lmcore.model.counting.Row`) of a model
    whose spec has `quant`: lmcore's own matrices from their widths, a component's by building
    it on the meta device (no memory) and storing its matrices as the format declares. A
    component that cannot be built alone (a block, a mixer: they take modules) counts its
    parameters in `dtype`."""
    part: Part = bp.parts["quant"]
    size = dtype.itemsize
    if row.params_each == 0:
        return 0
    if row.name == "token_embeddings":
        return _stored(part, bp.spec.d_model, bp.spec.vocab_size, "embedding")
    if row.entry is None and row.module.startswith("linear "):
        k, _, rest = row.module.removeprefix("linear ").partition("->")
        n = int(rest.split(" ")[0])
        bias = int(row.params_each) - int(k) * n
        role = "head" if row.name == "lm_head" else "matrix"
        return _stored(part, int(k), n, role) + bias * size
    if row.entry is None or row.entry.kind in ("block", "mixer"):
        return int(row.params_each * size)
    key = (row.module, row.kwargs, dtype)
    if cache is not None and key in cache:
        return cache[key]
    module = row.entry.component.create(**dict(row.kwargs), device="meta", dtype=dtype)
    found = module_bytes(part, module, dtype)
    if cache is not None:
        cache[key] = found
    return int(found)


def weight_bytes(acc: Any) -> dict[str, int]:
    """The bytes each row of `acc` (`lmcore.model.counting.Accounting`) takes for its weights:
    parameters × the dtype's size, or, with a weight format (`quant=`), its stored matrices
    as the format declares (`row_bytes`)."""
    size = acc.dtype.itemsize
    if "quant" not in acc.blueprint.parts:
        return {r.name: r.params * size for r in acc.rows}
    cache: dict[Any, int] = {}
    return {r.name: r.count * row_bytes(acc.blueprint, r, acc.dtype, cache) for r in acc.rows}
