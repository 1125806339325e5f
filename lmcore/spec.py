"""The spec's data: `ModelSpec`, `ComponentSpec`, the model keys and the canonical form.

`lmcore.syntax` reads a spec's text into items (the grammar: its names are importable from here
too); `lmcore.blueprint.resolve` gives the items their meaning against the registry (presets,
components, defaults, layer indices) and makes the `ModelSpec`. Nothing in a spec is evaluated
or imported.

The canonical form, `str(spec)`: the preset expanded, keys in the fixed order of `ORDER`, no
spaces. The keys and component arguments of the first release (`ALWAYS`, and every `Arg` with
``written="always"``) are always written, defaults filled in; every key or argument added
since (``written="changed"``: `head_dim`, `qkv_bias`, `window`, ...) is written only when it
differs from its default, so the canonical string of a spec that does not use it is the one it
always had. A key that differs by layer is written once for the whole model and then as
``key[layers]=value`` for the layers that differ, right after it: the whole-model value is the
key's default when some layer has it, else the value most layers have (the earliest on a tie);
for `norm`, whose whole-model value is also `ln_final`'s, it is that one. Layers are written as
the fewest ranges a greedy scan finds (`0::2`, `3`, `2:5`; a range reaching the last layer is
left open). So equal models have equal canonical strings, and `parse_spec(str(s)) == s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Union

from lmcore.components import DIMS, REQUIRED, Arg, Scalar, format_qualified, format_scalar

# The grammar's names, importable from here as before it had a module of its own.
from lmcore.syntax import MAX_DEPTH as MAX_DEPTH
from lmcore.syntax import MAX_INT as MAX_INT
from lmcore.syntax import MAX_NUMBER_CHARS as MAX_NUMBER_CHARS
from lmcore.syntax import Item as Item
from lmcore.syntax import LayerRange as LayerRange
from lmcore.syntax import Value as Value
from lmcore.syntax import parse_items as parse_items
from lmcore.syntax import parse_value as parse_value

# ------------------------------------------------------------------------------ data

# A component argument's value: a scalar, a component, or None (an optional component left out).
ArgValue = Union[Scalar, "ComponentSpec", None]


def format_value(value: ArgValue) -> str:
    """The canonical spelling of a key's or argument's value."""
    if value is None:
        return "none"
    if isinstance(value, ComponentSpec):
        return str(value)
    return format_scalar(value)


@dataclass(frozen=True)
class ComponentSpec:
    """One component: ``rope(theta=10000.0)``; `provider` only when the name is ambiguous.

    `args` holds the arguments the canonical form writes (an argument declared
    ``written="changed"`` is left out while it has its default); a value may itself be a
    `ComponentSpec` (``moe(expert=swiglu)``). `lmcore.blueprint.Blueprint.kwargs` gives every
    argument, defaults included.
    """

    name: str
    args: tuple[tuple[str, ArgValue], ...] = ()
    provider: str | None = None

    @property
    def kwargs(self) -> dict[str, ArgValue]:
        return dict(self.args)

    def __str__(self) -> str:
        qualified = format_qualified(self.provider, self.name)
        if not self.args:
            return qualified
        inner = ",".join(f"{k}={format_value(v)}" for k, v in self.args)
        return f"{qualified}({inner})"


@dataclass(frozen=True)
class LayerValue:
    """`key` takes `value` on `layers` (ascending indices), not the whole-model value."""

    key: str
    layers: tuple[int, ...]
    value: Any

    def format(self, num_layers: int) -> str:
        return f"{self.key}[{format_layers(self.layers, num_layers)}]={format_value(self.value)}"


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A fully resolved model: every hyperparameter and component, defaults filled in.

    Build one with `lmcore.parse_spec` (or `lmcore.resolve(...).spec`); `str(spec)` is its
    canonical spec string. The fields hold the whole-model values; `layers` the per-layer
    differences, and `at(i)` the spec of layer `i` alone.
    """

    vocab_size: int
    context_length: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    block: ComponentSpec
    tie_embeddings: bool
    norm: ComponentSpec
    ffn: ComponentSpec
    pos: ComponentSpec
    attn: ComponentSpec
    mixer: ComponentSpec = ComponentSpec("attention")  # the token mixer; attn is its kernel
    head_dim: int = 0  # 0: d_model / num_heads
    embed_scale: float = 1.0
    logit_softcap: float = 0.0
    logit_scale: float = 1.0
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: ComponentSpec | None = None
    qk_norm_scope: str = "head"
    query_scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    window: int = 0
    attn_softcap: float = 0.0
    attn_gate: bool = False
    attn_sinks: bool = False
    adapter: ComponentSpec | None = None  # lmcore.model.adapters: none, or e.g. lora(rank=8)
    # lmcore.model.parametrization: none (the standard one), or e.g. mup(base_width=256)
    parametrization: ComponentSpec | None = None
    quant: ComponentSpec | None = None  # lmcore.model.quant: none, or a weight format (int8)
    layers: tuple[LayerValue, ...] = ()

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.d_model // max(1, self.num_heads))
        if not self.query_scale:
            object.__setattr__(self, "query_scale", default_query_scale(self.head_dim))

    def component(self, kind: str) -> ComponentSpec:
        spec: ComponentSpec = getattr(self, kind)
        return spec

    def dims(self, kind: str) -> dict[str, int]:
        """The model dimensions a component of `kind` is built for (see `lmcore.components`)."""
        return {k: getattr(self, k) for k in DIMS[kind]}

    def at(self, layer: int) -> ModelSpec:
        """The spec of layer `layer`: its own values in the fields, no per-layer differences."""
        if not self.layers:
            return self
        own = {lv.key: lv.value for lv in self.layers if layer in lv.layers}
        return replace(self, layers=(), **own)

    def varies(self, key: str) -> bool:
        """Whether some layer's `key` differs from the whole-model value."""
        return any(lv.key == key for lv in self.layers)

    def default(self, key: str) -> Any:
        """The value `key` has when a spec does not give it (None: no default to leave out)."""
        if key == "head_dim":
            return self.d_model // self.num_heads if self.d_model % self.num_heads == 0 else None
        if key == "query_scale":
            return default_query_scale(self.head_dim)
        if key in SLOTS:
            return ComponentSpec(SLOTS[key])
        return KEY_ARGS[key].default

    def __str__(self) -> str:
        parts = []
        for key in ORDER:
            value = getattr(self, key)
            if key in ALWAYS or value != self.default(key):
                parts.append(f"{key}={format_value(value)}")
            parts += [lv.format(self.num_layers) for lv in self.layers if lv.key == key]
        return ",".join(parts)


def default_query_scale(head_dim: int) -> float:
    """`1 / sqrt(head_dim)`, computed as the attention kernels compute it."""
    return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0


# Model keys with plain values, `qk_norm` (a norm, or none) and `adapter` (one, or none). num_kv_heads, d_ff, head_dim
# and query_scale have derived defaults (lmcore.blueprint); REQUIRED marks them here.
MODEL_KEYS: Final[tuple[Arg, ...]] = (
    Arg("vocab_size", int, REQUIRED, "number of token ids", ge=1),
    Arg("context_length", int, REQUIRED, "longest sequence the model accepts", ge=1),
    Arg("d_model", int, REQUIRED, "width of the residual stream", ge=1),
    Arg("num_layers", int, REQUIRED, "number of transformer blocks", ge=1),
    Arg("num_heads", int, REQUIRED, "query heads per attention layer", ge=1),
    Arg("num_kv_heads", int, REQUIRED, "key/value heads (default: num_heads)", ge=1),
    Arg("d_ff", int, REQUIRED, "feed-forward hidden width (default: the ffn's own)", ge=1),
    Arg("tie_embeddings", bool, False, "lm_head shares token_embeddings.weight"),
    Arg("head_dim", int, REQUIRED, "width of each attention head (default: d_model / num_heads)",
        ge=1, written="changed"),
    Arg("embed_scale", float, 1.0, "token embeddings are multiplied by it (Gemma: sqrt(d_model))",
        gt=0.0, written="changed"),
    Arg("logit_softcap", float, 0.0, "caps the logits: cap·tanh(logits / cap); 0: none",
        ge=0.0, written="changed"),
    Arg("logit_scale", float, 1.0, "the logits are multiplied by it, before any cap (Falcon-H1's "
        "lm_head_multiplier)", gt=0.0, written="changed"),
    Arg("qkv_bias", bool, False, "biases on the q, k and v projections", written="changed"),
    Arg("out_bias", bool, False, "a bias on the attention output projection", written="changed"),
    Arg("qk_norm", "norm", None, "a norm on queries and keys before the rotation; none: no norm",
        written="changed"),
    Arg("qk_norm_scope", str, "head", "qk_norm over each head, or over the full q and k width",
        choices=("head", "full"), written="changed"),
    Arg("query_scale", float, REQUIRED, "multiplies q·k (default: 1 / sqrt(head_dim))", gt=0.0,
        written="changed"),
    Arg("window", int, 0, "sliding window: each query sees its last `window` keys; 0: all",
        ge=0, written="changed"),
    Arg("attn_softcap", float, 0.0, "caps the attention scores: cap·tanh(s / cap); 0: none",
        ge=0.0, written="changed"),
    Arg("attn_gate", bool, False, "a sigmoid gate on the attention output, sigmoid(gate_proj x)",
        written="changed"),
    Arg("attn_sinks", bool, False, "a learned logit per head in the softmax's denominator",
        written="changed"),
    Arg("adapter", "adapter", None, "a trainable update of the targeted matrices, the rest "
        "frozen (lora(rank=8)); none: a plain model", written="changed"),
    Arg("parametrization", "parametrization", None, "how widths set init, per-role learning "
        "rates and multipliers (mup(base_width=256)); none: the standard one",
        written="changed"),
    Arg("quant", "quant", None, "the matrices stored quantized, in a weight format (int8, "
        "q4_1, ...); none: in the model's dtype", written="changed"),
)  # fmt: skip
# The component slots (each of the kind it is named after) and the component each defaults to.
SLOTS: Final[Mapping[str, str]] = {
    "block": "prenorm",
    "norm": "rmsnorm",
    "ffn": "swiglu",
    "pos": "rope",
    "attn": "sdpa",
    "mixer": "attention",
}
KEY_ARGS: Final[Mapping[str, Arg]] = {a.name: a for a in MODEL_KEYS}
# The canonical order of the keys.
ORDER: Final = (
    "vocab_size", "context_length", "d_model", "num_layers", "num_heads", "num_kv_heads",
    "head_dim", "d_ff", "block", "tie_embeddings", "embed_scale", "logit_softcap",
    "logit_scale",
    "norm", "ffn", "pos", "mixer", "attn",
    "qkv_bias", "out_bias", "qk_norm", "qk_norm_scope", "query_scale", "window", "attn_softcap",
    "attn_gate", "attn_sinks", "adapter", "parametrization", "quant",
)  # fmt: skip
# The keys of the first release: written in every canonical string, default or not.
ALWAYS: Final = frozenset(
    ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "num_kv_heads",
     "d_ff", "block", "tie_embeddings", "norm", "ffn", "pos", "attn")
)  # fmt: skip
ALL_KEYS: Final = ORDER
# The keys that may differ by layer (`key[layers]=value`); the others hold for the whole model.
LAYER_KEYS: Final = (
    "d_ff", "block", "norm", "ffn", "pos", "mixer", "attn",
    "qkv_bias", "out_bias", "qk_norm", "qk_norm_scope", "query_scale", "window", "attn_softcap",
    "attn_gate", "attn_sinks",
)  # fmt: skip
# A spec with per-layer values has at most this many layers (each is resolved on its own).
MAX_LAYERED: Final = 4096

# ------------------------------------------------------------------------------ layers


def format_layers(layers: Sequence[int], num_layers: int) -> str:
    """The canonical spelling of a set of layer indices: ranges found by a greedy scan from the
    lowest index left, each with the step to the next index left (`2:5`, `1::2`, `0:7:3`); a
    step above 1 needs three indices, or the last two left when they reach the last layer; an
    index on its own otherwise. A range that reaches the last layer is written open (`4:`,
    `1::2`)."""
    left = sorted(set(layers))
    todo = set(left)
    parts = []
    for at, first in enumerate(left):
        if first not in todo:
            continue
        after = next((i for i in left[at + 1 :] if i in todo), None)
        run = [first]
        if after is not None:
            step = after - first
            while run[-1] + step in todo:
                run.append(run[-1] + step)
            open_end = run[-1] + step >= num_layers
            last_two = open_end and len(run) == 2 == len(todo)  # the two indices left
            if step > 1 and len(run) < 3 and not last_two:
                run = [first]
        todo.difference_update(run)
        if len(run) == 1:
            parts.append(str(first))
            continue
        step = run[1] - run[0]
        stop = "" if run[-1] + step >= num_layers else str(run[-1] + 1)
        parts.append(f"{first}:{stop}" if step == 1 else f"{first}:{stop}:{step}")
    return ",".join(parts)


def layer_groups(key: str, values: Sequence[Any], base: Any) -> tuple[LayerValue, ...]:
    """The `LayerValue`s of a key whose layers hold `values` against the whole-model `base`:
    one per value other than `base`, in the order of its first layer."""
    groups: dict[Any, list[int]] = {}
    for i, value in enumerate(values):
        if value != base:
            groups.setdefault(value, []).append(i)
    return tuple(LayerValue(key, tuple(idx), value) for value, idx in groups.items())


def canonical_base(values: Sequence[Any], default: Any = REQUIRED) -> Any:
    """The whole-model value the canonical form writes for a key whose layers hold `values`:
    `default` when some layer has it, else the value most layers have (the earliest on a tie)."""
    if default is not REQUIRED and default in values:
        return default
    counts: dict[Any, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    most = max(counts.values())
    return next(value for value in values if counts[value] == most)
