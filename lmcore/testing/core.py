"""What the checks share: the component under test, the test shapes, inputs and comparisons.

A `Target` is one registered component plus the argument values it is built with. Components are
built at two small shapes (`SHAPES`) so that a parameter or FLOP formula that is right at one
shape by coincidence is still caught. Everything here is plain torch; no pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, cast

import torch
from torch import Tensor, nn

from lmcore.components import DIMS, Component, Scalar, accepted_kwargs, format_scalar
from lmcore.interfaces import LayerContext, PositionalEncoding
from lmcore.registry import Entry, Registry

# Two model shapes; head_dim = d_model / num_heads in both, as in a real model.
SHAPES: Final[tuple[Mapping[str, int], ...]] = (
    dict(d_model=64, d_ff=128, num_heads=4, num_kv_heads=4, head_dim=16, context_length=32,
         window=0, attn_sinks=False),
    dict(d_model=48, d_ff=80, num_heads=2, num_kv_heads=2, head_dim=24, context_length=24,
         window=0, attn_sinks=False),
)  # fmt: skip
# Kinds that map (..., d_model) to (..., d_model), token by token.
TOKENWISE: Final = ("norm", "ffn")
BATCH: Final = 2
SEQ: Final = 8
SHORT: Final = 3  # queries when Sq < Sk (decoding with a KV cache)
# (Sq, Sk) pairs every attention check covers: a plain forward, and decoding with a KV cache.
ATTN_LENGTHS: Final = ((SEQ, SEQ), (SHORT, SEQ))
# A perturbation changed an output when it moved by more than this (outputs are O(1)).
CHANGED: Final = 1e-5
# Row offsets of the (B, T) positions: rows must be allowed to differ (packed sequences).
OFFSETS: Final = (0, 5)

# Tolerances against lmcore's reference computations: float32 kernels may sum in another order
# (online softmax), bfloat16 ones keep 8 bits of mantissa.
TOLERANCE: Final[Mapping[torch.dtype, tuple[float, float]]] = {  # (atol, rtol)
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
}
DTYPES: Final[Mapping[str, torch.dtype]] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ConformanceError(AssertionError):
    """A component breaks its kind's contract; the message says what broke and how to fix it."""


def fail(message: str) -> NoReturn:
    raise ConformanceError(message)


@dataclass(frozen=True)
class Settings:
    """How checks run: the `torch.compile` backend of the compile check, and the random seed."""

    compile_backend: str = "inductor"
    seed: int = 0


@dataclass(frozen=True)
class Target:
    """One component under test: its registry entry and the non-default argument values.

    `qualified` puts the provider in the label (``norm:lmcore-dyt:dyt``) when two plugins
    provide the same name.
    """

    entry: Entry
    overrides: tuple[tuple[str, Scalar], ...] = ()
    qualified: bool = False
    # The registry the entry came from: checks that build a whole model resolve the other
    # components there (None: the current one).
    registry: Registry | None = field(default=None, compare=False, repr=False)

    @property
    def component(self) -> Component:
        return self.entry.component

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def features(self) -> frozenset[str]:
        return self.component.features

    @property
    def label(self) -> str:
        """``kind:name``, with the provider when ambiguous and non-default arguments."""
        name = self.entry.name
        if self.qualified:
            name = f"{self.entry.provenance.qualifier}:{name}"
        args = ",".join(f"{k}={format_scalar(v)}" for k, v in self.overrides)
        return f"{self.kind}:{name}" + (f"({args})" if args else "")

    @property
    def missing(self) -> list[str]:
        """Required arguments with no value: the kit cannot build the component without them."""
        given = dict(self.overrides)
        return [a.name for a in self.component.args if a.required and a.name not in given]

    def arg_values(self) -> dict[str, Any]:
        """Every argument's value, as the factory gets it. A component-valued argument is
        resolved (a `lmcore.blueprint.Part`) in the target's registry, in a model around it."""
        args = self.component.args
        if any(a.kind is not None for a in args):
            from lmcore.blueprint import resolve

            bp = resolve(model_around(self, 0), self.registry)
            return bp.parts[self.kind].kwargs()
        values: dict[str, Any] = {a.name: a.default for a in args if not a.required}
        values.update(self.overrides)
        return values

    def dims(self, shape: int = 0, **overrides: int) -> dict[str, int]:
        """The model dimensions this kind receives, at test shape `shape`."""
        every = dict(SHAPES[shape])
        if self.kind == "attn" and "gqa" in self.features:
            every["num_kv_heads"] = every["num_heads"] // 2  # exercise the grouped path
        if self.kind == "mixer" and shape == 1:  # as `model_around` builds it
            every["num_kv_heads"] = every["num_heads"] // 2
        every.update(overrides)
        return {k: every[k] for k in DIMS[self.kind]}

    def kwargs(self, shape: int = 0, **overrides: int) -> dict[str, Any]:
        """Everything `flops` / `params` / the factory receive, as `build_model` passes it."""
        return {**self.dims(shape, **overrides), **self.arg_values()}

    def build(
        self,
        shape: int = 0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **overrides: int,
    ) -> nn.Module:
        kwargs = self.kwargs(shape, **overrides)
        self.component.check_shape(**kwargs)
        if self.kind == "block":
            return build_block(self, shape, device=device, dtype=dtype)
        if self.kind == "mixer":
            return build_mixer(self, shape, device=device, dtype=dtype)
        module = self.component.create(**kwargs, device=device, dtype=dtype)
        if not isinstance(module, nn.Module):
            fail(
                f"build returned a {type(module).__name__}, not a torch.nn.Module; "
                "make the factory return a module (subclass torch.nn.Module)"
            )
        return module


def model_around(target: Target, shape: int, num_layers: int = 2) -> str:
    """A model spec at test shape `shape` with `target` in its slot; the other components are
    the registry's defaults. Shape 1 uses grouped-query heads."""
    s = SHAPES[shape]
    kv_heads = s["num_heads"] if shape == 0 else s["num_heads"] // 2
    args = ", ".join(f"{k}={format_scalar(v)}" for k, v in target.overrides)
    name = target.entry.name
    if target.qualified:
        name = f"{target.entry.provenance.qualifier}:{name}"
    return (
        f"vocab_size=97, context_length={s['context_length']}, d_model={s['d_model']}, "
        f"num_layers={num_layers}, num_heads={s['num_heads']}, num_kv_heads={kv_heads}, "
        f"d_ff={s['d_ff']}, {target.kind}={name}" + (f"({args})" if args else "")
    )


def model_buildable(target: Target) -> str | None:
    """Why no model can be built around `target` in its registry: a default component of
    another slot is missing (a registry holding only the plugin under test)."""
    from lmcore.registry import get_registry
    from lmcore.spec import SLOTS

    registry = target.registry or get_registry()
    missing = [
        f"{kind} {name!r}"
        for kind, name in SLOTS.items()
        if kind != target.kind and name not in registry.names(kind)
    ]
    if not missing:
        return None
    return (
        f"the check builds a model around {target.label}, but the registry lacks the default "
        f"{', '.join(missing)} for the other slots (lmcore's built-ins are not loaded)"
    )


def norm_names(target: Target) -> tuple[str, ...]:
    """The names a block's `norms` declaration gives for the target's arguments (none for a
    component without one)."""
    names = target.component.norms
    if names is None:
        return ()
    return tuple(names(**accepted_kwargs(names, target.arg_values())))


def build_block(
    target: Target, shape: int = 0, *, device: Any = None, dtype: torch.dtype | None = None
) -> nn.Module:
    """A block under test with the parts a model gives it: lmcore's attention (the registry's
    default kernel), the default ffn, and the default norm for each one it asks for."""
    from lmcore.blueprint import resolve
    from lmcore.model.transformer import build_layer

    bp = resolve(model_around(target, shape, num_layers=1), target.registry)
    return build_layer(bp.layer(0), device=device, dtype=dtype)


def build_mixer(
    target: Target, shape: int = 0, *, device: Any = None, dtype: torch.dtype | None = None
) -> nn.Module:
    """A mixer under test as a model builds it: given `attention()`, lmcore's attention
    sub-layer with the registry's default kernel."""
    from lmcore.blueprint import resolve
    from lmcore.model.transformer import build_mixer as build

    bp = resolve(model_around(target, shape, num_layers=1), target.registry)
    return build(bp.layer(0), device=device, dtype=dtype)


def attention_paths(target: Target) -> tuple[str, ...]:
    """Where a mixer keeps the attention sub-layers it builds (none for other kinds)."""
    if target.kind != "mixer" or target.component.attention is None:
        return ()
    from lmcore.blueprint import resolve

    bp = resolve(model_around(target, 0, num_layers=1), target.registry)
    return bp.attention_paths()


def own_named(target: Target, named: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`named` (parameters, buffers or modules by name) without those of the parts lmcore
    accounts for on their own: a block's attn, ffn and norms; a mixer's attention sub-layers."""
    if target.kind == "block":
        parts = ("attn", "ffn", *norm_names(target))
        return [(n, x) for n, x in named if n.split(".", 1)[0] not in parts]
    if target.kind == "mixer":
        paths = attention_paths(target)
        if "" in paths:
            return []
        return [
            (n, x) for n, x in named if not any(n == p or n.startswith(f"{p}.") for p in paths)
        ]
    return named


def call(fn: str, kwargs: Mapping[str, Any]) -> str:
    """``params(d_model=64, bias=True)``: what a declaration was called with, for messages."""
    return f"{fn}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


# ------------------------------------------------------------------------------------ inputs


def shape_of(target: Target, shape: int = 0) -> Mapping[str, int]:
    """The full model shape behind `target.dims(shape)` (inputs need d_model, heads, ...)."""
    every = dict(SHAPES[shape])
    every.update(target.dims(shape))
    return every


def positions(batch: int, seq: int, offsets: tuple[int, ...] = OFFSETS) -> Tensor:
    """`(batch, seq)` positions, row b starting at `offsets[b]` (batch 1: from 0)."""
    start = torch.tensor(offsets[:batch] if batch > 1 else (0,))[:, None]
    return start + torch.arange(seq)[None, :]


def make_inputs(
    target: Target,
    dtype: torch.dtype = torch.float32,
    *,
    shape: int = 0,
    batch: int = BATCH,
    seq: int = SEQ,
    kv_seq: int | None = None,
    lead: tuple[int, ...] = (),
) -> dict[str, Tensor]:
    """Random inputs for one forward of `target`'s kind (seeded by the caller).

    norm and ffn get `x: (batch, *lead, seq, d_model)`: their contract is `(..., d_model)`;
    a block gets `x: (batch, seq, d_model)`; a mixer that and the tokens' `positions`.
    """
    s = shape_of(target, shape)
    d_model, heads, head_dim = s["d_model"], s["num_heads"], s["head_dim"]
    if target.kind in TOKENWISE:
        return {"x": torch.randn(batch, *lead, seq, d_model, dtype=dtype)}
    if target.kind == "block":
        return {"x": torch.randn(batch, seq, d_model, dtype=dtype)}
    if target.kind == "mixer":
        return {
            "x": torch.randn(batch, seq, d_model, dtype=dtype),
            "positions": positions(batch, seq),
        }
    if target.kind == "attn":
        kv_heads, sk = s["num_kv_heads"], kv_seq or seq
        return {
            "q": torch.randn(batch, heads, seq, head_dim, dtype=dtype),
            "k": torch.randn(batch, kv_heads, sk, head_dim, dtype=dtype),
            "v": torch.randn(batch, kv_heads, sk, head_dim, dtype=dtype),
        }
    # pos: k has fewer heads than q, as when the model uses grouped-query attention.
    return {
        "x": torch.randn(batch, seq, d_model, dtype=dtype),
        "q": torch.randn(batch, heads, seq, head_dim, dtype=dtype),
        "k": torch.randn(batch, max(1, heads // 2), seq, head_dim, dtype=dtype),
        "positions": positions(batch, seq),
    }


def run(kind: str, module: nn.Module, inputs: Mapping[str, Tensor]) -> list[Tensor]:
    """One forward of a component, as the model calls it; returns every output tensor.

    pos: the embedded x, then q and k rotated (if it rotates), then the bias (if it has one).
    """
    if kind in TOKENWISE:
        return [module(inputs["x"])]
    if kind == "block":
        return [module(inputs["x"], LayerContext())]
    if kind == "mixer":
        return [module(inputs["x"], LayerContext(positions=inputs["positions"]))]
    if kind == "attn":
        return [module(inputs["q"], inputs["k"], inputs["v"], causal=True)]
    pos, p = hooks(module), inputs["positions"]
    out: list[Tensor] = [pos.embed(inputs["x"], p)]
    rotate = pos.rotation(p)
    if rotate is not None:
        out += [rotate(inputs["q"]), rotate(inputs["k"])]
    bias = pos.attention_bias(p, p)
    if bias is not None:
        out.append(bias)
    return out


def hooks(module: nn.Module) -> PositionalEncoding:
    """A pos module seen through its protocol (the `build` check verifies it implements it)."""
    return cast(PositionalEncoding, module)


def output_names(kind: str, module: nn.Module, inputs: Mapping[str, Tensor]) -> list[str]:
    """Names of `run`'s outputs, for messages."""
    if kind != "pos":
        return ["output"]
    pos, p = hooks(module), inputs["positions"]
    names = ["embed(x, positions)"]
    if pos.rotation(p) is not None:
        names += ["rotation(positions)(q)", "rotation(positions)(k)"]
    if pos.attention_bias(p, p) is not None:
        names.append("attention_bias(positions, positions)")
    return names


# ------------------------------------------------------------------------------- comparisons


def describe(t: Tensor) -> str:
    return f"shape {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def first_line(e: BaseException) -> str:
    """The first non-blank line of an exception's message (its type when it has none)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def mismatch(
    actual: Tensor, expected: Tensor, atol: float, rtol: float, *, equal_nan: bool = False
) -> str | None:
    """None when `actual` is close to `expected`; else where and by how much it is not.

    `equal_nan` for comparing two runs of the same component, where a NaN is the forward
    check's business, not a difference.
    """
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)} where {tuple(expected.shape)} was expected"
    a, e = actual.detach().float(), expected.detach().float()
    bad = ~torch.isclose(a, e, atol=atol, rtol=rtol, equal_nan=equal_nan)
    if not bool(bad.any()):
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    worst = float((a - e).abs().nan_to_num(nan=float("inf")).max())
    return (
        f"{int(bad.sum())} of {bad.numel()} values differ, max |diff| {worst:.3g} "
        f"(atol={atol}, rtol={rtol}); first at index {where}: {float(a[where]):.6g} "
        f"instead of {float(e[where]):.6g}"
    )


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCE[dtype]


Fn = Callable[[Target, str, Settings], None]


@dataclass(frozen=True)
class Check:
    """One contract: which kinds it applies to, the feature it needs and its variants."""

    name: str
    kinds: frozenset[str]
    fn: Fn
    doc: str
    feature: str | None = None
    variants: tuple[str, ...] = ("",)
    defaults_only: bool = False  # too costly to repeat for every argument variant
    declaration: str | None = None  # a Component field the check needs; skipped when None
    # Why the check cannot run on a target (e.g. no model can be built around it), or None.
    needs: Callable[[Target], str | None] | None = None

    def applies_to(self, target: Target) -> bool:
        return (
            target.kind in self.kinds
            and (self.feature is None or self.feature in target.features)
            and not (self.defaults_only and target.overrides)
        )


CHECKS: list[Check] = []


def check(
    name: str,
    kinds: tuple[str, ...],
    *,
    feature: str | None = None,
    variants: tuple[str, ...] = ("",),
    defaults_only: bool = False,
    declaration: str | None = None,
    needs: Callable[[Target], str | None] | None = None,
) -> Callable[[Fn], Fn]:
    """Register a check; its docstring's first line is the contract it states."""

    def register(fn: Fn) -> Fn:
        doc = " ".join((fn.__doc__ or name).strip().split("\n\n")[0].split())
        CHECKS.append(
            Check(
                name,
                frozenset(kinds),
                fn,
                doc,
                feature,
                variants,
                defaults_only,
                declaration,
                needs,
            )
        )
        return fn

    return register
