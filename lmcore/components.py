"""What a plugin declares: `Arg`, `Component` and `Preset`.

A `Component` is a recipe, not a module: it names a factory that takes flat keyword arguments, the
arguments a spec may set, and how many parameters and FLOPs the module will have, so a spec is
validated and accounted before any weight exists.

Factories and accounting functions receive only the keyword arguments their signature names (or
everything, if it takes ``**kwargs``). On offer, by kind:

=======  ===========================================================================
kind     model dimensions on offer (plus every declared argument)
=======  ===========================================================================
norm     ``d_model``
ffn      ``d_model``, ``d_ff``
pos      ``d_model``, ``num_heads``, ``head_dim``, ``context_length``
attn     ``num_heads``, ``num_kv_heads``, ``head_dim``, ``window`` (0: none), ``attn_sinks``
block    ``d_model``; its factory also gets the modules it wires: ``attn``, ``ffn`` and
         ``norm`` (a function building one more norm per call)
mixer    ``d_model``, ``num_heads``, ``num_kv_heads``, ``head_dim``, ``context_length``; its
         factory also gets ``attention``, a function building lmcore's attention sub-layer
         for the layer (its kernel, projections and options) per call
adapter  ``in_features``, ``out_features``, ``splits`` (one call per targeted matrix; the
         module maps x to the update's output and gives ``delta()``, the update as a matrix:
         `lmcore.model.adapters`)
=======  ===========================================================================

Factories also get ``device`` and ``dtype``; ``flops`` also gets ``seq_len`` (query tokens of one
sequence) and ``kv_len`` (key tokens; equal to ``seq_len`` in a plain forward pass).
``activations`` gets those two plus ``batch`` (sequences) and ``dtype`` (the model's
``torch.dtype``); a pos component's ``activations`` also gets ``num_layers``.

An argument may itself take a component (``Arg("expert", "ffn", "swiglu", ...)``: its type is a
kind): the spec writes it nested, ``moe(expert=swiglu(d_ff=512))``, it is checked against that
component's declaration, and the factory and declarations receive it resolved, as a
`lmcore.blueprint.Part` (``part.create(d_model=..., device=..., dtype=...)``,
``part.count("params", d_model=...)``).
"""

from __future__ import annotations

import inspect
import keyword
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from lmcore.errors import (
    InvalidComponentError,
    PluginError,
    ValueProblem,
    ValueTypeProblem,
    clip,
    describe_exception,
    did_you_mean,
    one_of,
)

Scalar = int | float | bool | str

KINDS: Final = ("norm", "ffn", "pos", "attn", "block", "mixer")
# The kinds of the training recipe: found, declared and resolved like the model's, but built
# by the runner, not into the model (`lmcore.train.recipe`).
RECIPE_KINDS: Final = ("optimizer", "schedule")
# The kinds that change a built model after it is assembled: an adapter (LoRA) adds a small
# trainable update to each targeted matrix and freezes the rest (`lmcore.model.adapters`).
ADAPTER_KINDS: Final = ("adapter",)
# How a built model's widths set its initialisation, per-role learning rates and output and
# attention multipliers (muP): a spec key, resolved like the model's components, whose factory
# gives rules, not a module (`lmcore.model.parametrization`).
PARAMETRIZATION_KINDS: Final = ("parametrization",)
# The kinds that store a built model's matrices another way: a weight format (`quant=int8`)
# keeps each targeted matrix quantized and multiplies by it so (`lmcore.model.quant`).
WEIGHT_KINDS: Final = ("quant",)
ALL_KINDS: Final = (
    *KINDS, *ADAPTER_KINDS, *WEIGHT_KINDS, *RECIPE_KINDS, *PARAMETRIZATION_KINDS
)

# The roles a component declares for the parameters it creates (`lmcore.model.roles`): a
# hidden matrix, several packed in one tensor, the embedding, the output head, a norm's gain,
# a bias, a mixture's router, per-head or per-channel scalars, a convolution's filter.
ROLES: Final = (
    "matrix", "packed", "embedding", "head", "gain", "bias", "router", "scalar", "conv",
)  # fmt: skip

# The model dimensions each kind may ask for, in the order the docs list them.
DIMS: Final[Mapping[str, tuple[str, ...]]] = {
    "norm": ("d_model",),
    "ffn": ("d_model", "d_ff"),
    "pos": ("d_model", "num_heads", "head_dim", "context_length"),
    "attn": ("num_heads", "num_kv_heads", "head_dim", "window", "attn_sinks"),
    "block": ("d_model",),
    "mixer": ("d_model", "num_heads", "num_kv_heads", "head_dim", "context_length"),
    # What lmcore offers an adapter's factory, once per targeted matrix: its input and output
    # widths, and the logical matrices a packed one holds (their rows; `(out_features,)` for
    # a plain matrix). See `lmcore.model.adapters`.
    "adapter": ("in_features", "out_features", "splits"),
    # What lmcore offers a weight format's factory and declarations, once per stored matrix:
    # its widths and its role (matrix, packed, embedding, head); `stored` gives the bytes
    # the stored matrix holds, which describe and the size check count in its weight's place.
    "quant": ("in_features", "out_features", "role"),
    # What the runner offers the recipe kinds (see `lmcore.train.recipe`).
    "optimizer": ("groups", "lr", "weight_decay", "betas", "eps"),
    "schedule": ("lr", "min_lr", "warmup", "decay_steps", "steps"),
    # What a parametrization's factory gets: the model's width, its vocabulary and whether
    # the head is the embedding (`lmcore.model.parametrization`).
    "parametrization": ("d_model", "vocab_size", "tie_embeddings"),
}
# What a block's factory receives besides its dimensions and arguments: the attention sub-layer,
# the feed-forward network, and `norm()`, which builds one more norm of the model's kind per call.
BLOCK_PARTS: Final = ("attn", "ffn", "norm")
# What a mixer's factory receives besides its dimensions and arguments: `attention()`, which
# builds lmcore's attention sub-layer for the layer (kernel, projections, options) per call.
MIXER_PARTS: Final = ("attention",)

# What a component may declare it can do. Unknown words are a declaration error, so a typo
# cannot silently switch a check off.
# nocache (any kind): cannot work with a KV cache (generation refuses it before starting;
# without it the conformance kit's cache check holds the component to the contract).
FEATURES: Final[Mapping[str, frozenset[str]]] = {
    "norm": frozenset({"compile", "nocache"}),
    # empty (ffn): no feed-forward sub-layer at all (`ffn=none`): blocks wire none, nor its norms.
    "ffn": frozenset({"compile", "nocache", "empty"}),
    # rotary: rotates q and k; absolute: adds to the token embeddings; bias: adds an attention
    # bias; relative: q.k after the encoding depends only on the offset between positions.
    "pos": frozenset({"rotary", "absolute", "bias", "relative", "compile", "nocache"}),
    # gqa: takes k, v with fewer heads than q; bias: accepts an additive bias; mask: accepts a
    # boolean mask (True = may attend); scale: takes the query scale (`scale=`, else the model
    # multiplies q itself); softcap: caps the scores, cap·tanh(s / cap) (`softcap=`); window: a
    # sliding window, each query sees its last `window` keys (`window=`); sinks: a learned
    # logit per head added to the softmax's denominator (`sinks=`, a (H,) tensor; gpt-oss);
    # documents: takes the keys' document ids (`documents=`, (B, Sk) int64, non-decreasing
    # per row) and lets each query see only its own document's keys (packed rows).
    "attn": frozenset(
        {"gqa", "bias", "mask", "scale", "softcap", "window", "sinks", "documents", "compile",
         "nocache"}
    ),
    # residual: with both sub-layers giving zeros the block returns its input unchanged (the
    # stream passes through; the kit checks it).
    # nomup: its residual stream is not Θ(1) per coordinate by design (nGPT's unit sphere), so
    # muP's rules do not hold for it: `parametrization=mup` refuses it by name, and the kit's
    # coordinate check skips it saying so.
    "block": frozenset({"residual", "compile", "nocache", "nomup"}),
    # mask: takes left-padded batches (a pad token changes no state and no real token's
    # output: attention masks pad keys, a recurrent mixer leaves its state as it was);
    # documents: takes packed rows (`context.documents`): no information crosses a document
    # boundary (attention within each document, a recurrent state and a convolution's tail
    # reset at each document's first token).
    "mixer": frozenset({"mask", "documents", "compile", "nocache"}),
    # nofsdp (optimizer): needs whole tensors (Muon's matrices), not FSDP's shards of them:
    # `lmcore train --parallel fsdp` refuses it before the run starts.
    "adapter": frozenset(),
    "quant": frozenset(),
    # entrywise (optimizer): its update is normalised entry by entry (Adam, Lion), so the
    # per-role learning-rate rules of muP for Adam hold (`parametrization=mup` needs it).
    "optimizer": frozenset({"nofsdp", "entrywise"}),
    "schedule": frozenset(),
    "parametrization": frozenset(),
}

NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_RESERVED_ARGS: Final = frozenset(
    {"device", "dtype", "seq_len", "kv_len", "batch", "num_layers", "d_ff"}
)
_ARG_TYPES: Final = (int, float, bool, str)
# Declarations a component may leave out (None).
OPTIONAL_DECLARATIONS: Final = (
    "activations", "default_d_ff", "validate", "buffers", "norms", "shared_input",
    "active_params", "temporaries", "modules", "state", "attention", "stored",
)  # fmt: skip
# How an argument appears in the canonical form: every value ("always", the rule since the
# first release), or only a value other than the default ("changed": for arguments added to a
# released component, so that the canonical strings of specs that do not use them stay as
# they were).
WRITTEN: Final = ("always", "changed")


class _Required:
    """Marker for an argument without a default."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


@dataclass(frozen=True)
class Arg:
    """One argument a component accepts from the spec, e.g. ``Arg("eps", float, 1e-5, "...")``.

    ``type`` is int, float, bool or str, or a component kind (``"norm"``, ``"ffn"``, ...) for an
    argument whose value is itself a component: its default is then spec text (``"swiglu"``,
    ``"rmsnorm(eps=1e-6)"``) or None (optional: written ``none``, the factory gets None).
    ``gt`` / ``ge`` bound numbers from below; ``choices`` restricts strings.
    ``written="changed"`` leaves the argument out of the canonical form while it has its
    default: declare every argument added to an already released component so, and the
    canonical strings (run names, hashes) of specs that do not use it stay what they were.
    ``applies_with``: the other arguments a boolean takes effect with (rope's ``truncate`` with
    ``scaling=yarn``); the conformance kit's variant that flips it sets them too.
    """

    name: str
    type: type | str
    default: Any = REQUIRED
    help: str = ""
    gt: float | None = None
    ge: float | None = None
    choices: tuple[str, ...] | None = None
    written: str = "always"
    applies_with: tuple[tuple[str, Any], ...] = ()

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def kind(self) -> str | None:
        """The component kind this argument takes, or None for a plain value."""
        return self.type if isinstance(self.type, str) else None

    @property
    def type_name(self) -> str:
        return self.type if isinstance(self.type, str) else self.type.__name__

    def check(self, value: Any) -> Scalar:
        """Return `value` converted to this argument's type, or raise a `ValueProblem` saying
        what is wrong (a ValueError; a `ValueTypeProblem`, a TypeError too, for the type), which
        the caller places. (A component-valued argument is checked by `lmcore.blueprint`,
        against the registry.)"""
        if isinstance(self.type, str):
            raise ValueTypeProblem(f"takes a {self.type} component, checked against the registry")
        expected = self.type.__name__
        if self.type is float and type(value) is int:
            value = float(value)  # 10000 is a fine theta; canonical form writes 10000.0
        if type(value) is not self.type:
            shown = (
                format_scalar(value) if isinstance(value, bool) else clip(repr(value), quote=False)
            )
            raise ValueTypeProblem(f"expects {expected}, got {type(value).__name__} {shown}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.gt is not None and not value > self.gt:
                raise ValueProblem(f"must be > {self.gt}, got {value!r}")
            if self.ge is not None and not value >= self.ge:
                raise ValueProblem(f"must be >= {self.ge}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueProblem(
                f"must be one of {one_of(self.choices)}, got {clip(str(value))}"
                + did_you_mean(str(value), self.choices)
            )
        return cast(Scalar, value)

    def describe(self) -> str:
        """`name: type = default` as shown by `lmcore plugins`."""
        if self.required:
            default = "required"
        elif self.default is None:
            default = "none"
        else:
            default = self.default if self.kind else format_scalar(self.default)
        return f"{self.name}: {self.type_name} = {default}"


def _zero(**_: Any) -> int:
    return 0


@dataclass(frozen=True)
class Component:
    """A component a plugin provides: kind, name, factory, arguments and accounting.

    params(**dims, **args) -> int: the parameter count of one built module.
    flops(**dims, **args, seq_len, kv_len) -> int: forward matmul FLOPs (2·m·n·p) for one sequence.
    activations(**dims, **args, batch, seq_len, kv_len, dtype) -> int: bytes of the distinct
        tensors one module's forward saves for backward in the model (parameters and buffers
        excluded; views of its inputs included), for `batch` sequences. A pos component counts
        its whole forward: `embed`, `attention_bias` and `rotation` applied to q and k in each of
        `num_layers` attention sub-layers (those of the layers it serves whose mixer attends).
        None (the default): `lmcore describe` measures them instead, on the meta device, which
        is exact but costs about a second. `lmcore.testing` checks a
        declaration against that measurement.
    default_d_ff(d_model) -> int: for ffn components, the hidden width used when a spec gives none.
    norms(**args) -> sequence of str: for block components, the attribute names of the norms the
        block builds with its `norm()` argument, in the order it calls it (``("ln1", "ln2")``);
        lmcore accounts one norm row per name and the kit holds the block to it.
    shared_input(**args) -> bool: for block components, True when the block hands the attention
        and the feed-forward network the same tensor and runs the feed-forward network first
        (a parallel block with one norm): the attention's projections then keep no input of
        their own for backward, the feed-forward network's counts it.
    validate(**dims, **args): raise ValueError with a sentence when the shape cannot work.
    buffers(**dims, **args, dtype) -> int: bytes of the buffers one built module holds (e.g.
        RoPE's cos/sin tables) in a model of `dtype`. lmcore's size check adds them to the
        weights before anything is allocated. None (the default): unknown until built;
        `lmcore describe` reads them off a meta-device build.
    active_params(**dims, **args) -> int: the parameters one token's forward uses, where
        that is fewer than `params` (a mixture of experts: the router, the top-k experts and
        the shared ones). None (the default): all of them. `flops` counts the work actually
        done, i.e. that of the active parameters.

    temporaries(**dims, **args, dtype) -> int: bytes the factory allocates beyond the module's
        parameters and buffers while it builds, freed when it returns (e.g. the angles RoPE's
        tables are computed from). lmcore's size check adds the largest to the total, so the
        check covers the build's peak. None (the default): none.
    modules(**dims, **args) -> int: the `nn.Module` objects one built module is, itself and
        every submodule included (a mixture of experts: one per expert and more). They cost
        host memory and build time on any device, meta included; lmcore's size check counts
        them. None (the default): a few, within lmcore's per-layer estimate.
    state(**dims, **args, dtype) -> (per_token, per_sequence): for mixer components, the bytes
        of one sequence's decoding state in a model of `dtype`, as the module's
        `decoding_state` allocates it: `per_token` for each position of the context (keys and
        values, a latent: grows with the context) and `per_sequence` whatever the context (a
        recurrent state, a convolution's tail). `lmcore describe` shows both; the kit checks
        them against what `decoding_state` allocates. None (the default): unknown.
    attention(**args) -> sequence of str: for mixer components, where the mixer keeps each
        attention sub-layer it builds with its `attention()` argument, in the order it calls it,
        as attribute paths below the mixer (``""``: the mixer is that sub-layer, as the built-in
        `attention` mixer; ``"first"``: its attribute `first`). lmcore accounts each one's
        projections, kernel and norms itself, so the mixer's own declarations leave them out.
        None (the default): it builds none.
    stored(in_features, out_features, role, **args) -> int: for weight formats (quant), the
        bytes one stored matrix holds (its tensors and what its kernel keeps), which describe
        and the size check count in its weight's place.

    `activations` and `buffers` may also give None for particular arguments, meaning unknown
    (e.g. a mixture whose expert declares none): they are then measured as if undeclared.

    lmcore calls these through `invoke` / `count`: an exception, or a count that is not a whole
    number, becomes a `PluginError` naming the component (and, from the registry, its
    distribution).
    """

    kind: str
    name: str
    build: Callable[..., Any]
    args: tuple[Arg, ...] = ()
    help: str = ""
    params: Callable[..., int] = _zero
    flops: Callable[..., int] = _zero
    activations: Callable[..., int] | None = None
    features: frozenset[str] = field(default_factory=frozenset)
    default_d_ff: Callable[[int], int] | None = None
    validate: Callable[..., None] | None = None
    buffers: Callable[..., int] | None = None
    norms: Callable[..., Sequence[str]] | None = None
    shared_input: Callable[..., bool] | None = None
    active_params: Callable[..., int] | None = None
    temporaries: Callable[..., int] | None = None
    modules: Callable[..., int] | None = None
    state: Callable[..., tuple[int, int]] | None = None
    attention: Callable[..., Sequence[str]] | None = None
    stored: Callable[..., int] | None = None

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)

    def create(self, **kwargs: Any) -> Any:
        """Build the module from flat keyword arguments (extra ones are dropped by signature)."""
        return invoke(self, "build", kwargs)

    def count_params(self, **kwargs: Any) -> int:
        return count(self, "params", kwargs)

    def count_flops(self, **kwargs: Any) -> int:
        return count(self, "flops", kwargs)

    def count_buffers(self, **kwargs: Any) -> int | None:
        """Declared buffer bytes, or None when the component declares none (or unknown)."""
        return None if self.buffers is None else count_or_unknown(self, "buffers", kwargs)

    def check_shape(self, **kwargs: Any) -> None:
        """Raise ValueError (the component's own sentence) when the shape cannot work."""
        if self.validate is not None:
            invoke(self, "validate", kwargs, allow=(ValueError,))


@dataclass(frozen=True)
class Preset:
    """A named starting point for specs: ``Preset("tinystories", "vocab_size=10000, ...")``."""

    name: str
    spec: str
    help: str = ""


_ROLES: Final[Mapping[str, str]] = {
    "build": "factory",
    "params": "params declaration",
    "flops": "flops declaration",
    "activations": "activations declaration",
    "buffers": "buffers declaration",
    "active_params": "active_params declaration",
    "validate": "validate",
    "default_d_ff": "default_d_ff",
    "norms": "norms declaration",
    "shared_input": "shared_input declaration",
    "temporaries": "temporaries declaration",
    "modules": "modules declaration",
    "state": "state declaration",
    "attention": "attention declaration",
    "stored": "stored declaration",
}


def invoke(
    c: Component,
    what: str,
    kwargs: Mapping[str, Any],
    where: object = None,
    *,
    allow: tuple[type[Exception], ...] = (),
) -> Any:
    """Call the component's `what` (a field of `Component`) with the keyword arguments its
    signature takes (None when it is an optional declaration left out). Any exception but
    those in `allow` becomes a `PluginError` naming the component and `where` it comes from
    (a `Provenance`), so a fault in plugin code is never a bare traceback."""
    fn = getattr(c, what)
    if fn is None:  # an optional declaration left out
        return None
    try:
        return call_with(fn, kwargs)
    except allow:
        raise
    except PluginError:
        raise  # already names its component: a norm a block's factory builds
    except Exception as e:
        raise PluginError(
            f"{_who(c, where)}: its {_ROLES[what]} raised {describe_exception(e)}"
        ) from e


# Declarations that may answer None (unknown for these arguments: measured instead).
MAY_BE_UNKNOWN: Final = ("activations", "buffers")


def count(c: Component, what: str, kwargs: Mapping[str, Any], where: object = None) -> int:
    """A declared count (params, flops, activations, buffers, default_d_ff, active_params): a
    whole number, at least 0 (at least 1 for default_d_ff); an integral float is taken as its
    integer."""
    return _whole(c, what, kwargs, where, invoke(c, what, kwargs, where))


def count_or_unknown(
    c: Component, what: str, kwargs: Mapping[str, Any], where: object = None
) -> int | None:
    """`count`, except that activations and buffers may give None: unknown for these
    arguments (see `Component`)."""
    value = invoke(c, what, kwargs, where)
    if value is None and what in MAY_BE_UNKNOWN:
        return None
    return _whole(c, what, kwargs, where, value)


def _whole(c: Component, what: str, kwargs: Mapping[str, Any], where: object, value: Any) -> int:
    n = whole_number(value)
    least = 1 if what == "default_d_ff" else 0
    if n is None or n < least:
        given = accepted_kwargs(getattr(c, what), kwargs)
        call = f"{what}({', '.join(f'{k}={v!r}' for k, v in given.items())})"
        shown = clip(repr(value), quote=False)
        raise PluginError(
            f"{_who(c, where)}: its {_ROLES[what]} gives {call} = {shown}; "
            f"it must give a whole number >= {least}"
        )
    return n


def count_state(
    c: Component, kwargs: Mapping[str, Any], where: object = None
) -> tuple[int, int] | None:
    """A mixer's declared decoding state, `(per_token, per_sequence)` bytes of one sequence;
    None when it declares none. Anything but two whole numbers >= 0 is a `PluginError`."""
    value = invoke(c, "state", kwargs, where)
    if value is None and c.state is None:
        return None
    pair = tuple(value) if isinstance(value, tuple | list) else ()
    numbers = [whole_number(v) for v in pair]
    if len(numbers) != 2 or any(n is None or n < 0 for n in numbers):
        given = accepted_kwargs(c.state, kwargs) if c.state is not None else {}
        call = f"state({', '.join(f'{k}={v!r}' for k, v in given.items())})"
        raise PluginError(
            f"{_who(c, where)}: its state declaration gives {call} = "
            f"{clip(repr(value), quote=False)}; it must give (bytes per token of context, "
            "bytes per sequence), two whole numbers >= 0"
        )
    per_token, per_sequence = numbers
    assert per_token is not None and per_sequence is not None
    return per_token, per_sequence


def whole_number(value: object) -> int | None:
    """`value` as an int when it is one (a float only when integral), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _who(c: Component, where: object) -> str:
    name = f"{c.kind} {c.name!r}"
    return f"{name} from {where}" if where is not None else name


def call_with(fn: Callable[..., Any], available: Mapping[str, Any]) -> Any:
    """Call `fn` with the subset of `available` its signature accepts."""
    return fn(**accepted_kwargs(fn, available))


def accepted_kwargs(fn: Callable[..., Any], available: Mapping[str, Any]) -> dict[str, Any]:
    from torch import nn  # here, not at the top: declaring components needs no torch

    if isinstance(fn, type) and fn.__init__ is nn.Module.__init__:  # type: ignore[misc]
        return {}  # a module without its own __init__ takes nothing (Module's is *args, **kwargs)
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return dict(available)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in available.items() if k in names}


def format_scalar(value: Scalar) -> str:
    """The canonical spelling of an argument value; `parse_spec` reads it back unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if NAME_RE.match(value) and value not in ("true", "false"):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def format_qualified(qualifier: str | None, name: str) -> str:
    """``dist:name`` as a spec is typed: the qualifier quoted when it is not a plain name
    (``"2norms":rmsnorm``, ``"my norms":rmsnorm``), so every name lmcore suggests parses."""
    return name if qualifier is None else f"{format_scalar(qualifier)}:{name}"


def validate_component(item: object) -> Component:
    """Check a declaration from a plugin; raise InvalidComponentError naming what is wrong."""
    if not isinstance(item, Component):
        raise InvalidComponentError(
            f"lmcore_components() must return lmcore.Component objects, got {type(item).__name__}"
        )
    c = item
    if c.kind not in ALL_KINDS:
        raise InvalidComponentError(
            f"component {c.name!r} has kind {c.kind!r}; kinds are {one_of(ALL_KINDS)}"
            + did_you_mean(str(c.kind), ALL_KINDS)
        )
    what = f"{c.kind} {c.name!r}"
    if not isinstance(c.name, str) or not NAME_RE.match(c.name):
        raise InvalidComponentError(
            f"{c.kind} component name {c.name!r} is not a valid name "
            "(letters, digits, '_', '-', '.'; starting with a letter or '_')"
        )
    for fn_name in ("build", "params", "flops"):
        if not callable(getattr(c, fn_name)):
            raise InvalidComponentError(f"{what}: {fn_name} must be callable")
    for fn_name in OPTIONAL_DECLARATIONS:
        fn = getattr(c, fn_name)
        if fn is not None and not callable(fn):
            raise InvalidComponentError(f"{what}: {fn_name} must be callable or None")
    if not isinstance(c.help, str):
        raise InvalidComponentError(f"{what}: help must be a string, got {type(c.help).__name__}")
    if not isinstance(c.features, set | frozenset | tuple | list) or not all(
        isinstance(f, str) for f in c.features
    ):
        raise InvalidComponentError(
            f"{what}: features must be a set of strings, e.g. frozenset({{'compile'}}); "
            f"got {clip(repr(c.features), quote=False)}"
        )
    if not isinstance(c.args, tuple | list):
        raise InvalidComponentError(
            f"{what}: args must be a tuple of lmcore.Arg objects, got {type(c.args).__name__}"
        )
    unknown = set(c.features) - FEATURES[c.kind]
    if unknown:
        bad = sorted(unknown)[0]
        raise InvalidComponentError(
            f"{what}: unknown feature {bad!r}; {c.kind} features are {one_of(FEATURES[c.kind])}"
            + did_you_mean(bad, FEATURES[c.kind])
        )
    seen: set[str] = set()
    for a in c.args:
        if not isinstance(a, Arg):
            raise InvalidComponentError(f"{what}: args must be lmcore.Arg objects, got {a!r}")
        _check_arg_fields(what, a)
        if not a.name.isidentifier() or keyword.iskeyword(a.name):
            raise InvalidComponentError(f"{what}: argument name {a.name!r} is not an identifier")
        if a.name in seen:
            raise InvalidComponentError(f"{what}: argument {a.name!r} is declared twice")
        parts = {"block": BLOCK_PARTS, "mixer": MIXER_PARTS}.get(c.kind, ())
        passed = _RESERVED_ARGS | set(DIMS[c.kind]) | set(parts)
        if a.name in passed:
            raise InvalidComponentError(
                f"{what}: argument {a.name!r} clashes with a name lmcore passes itself "
                f"({one_of(passed)})"
            )
        if a.written not in WRITTEN:
            raise InvalidComponentError(
                f"{what}: argument {a.name!r} has written={a.written!r}; use one of "
                f"{one_of(WRITTEN)}" + did_you_mean(str(a.written), WRITTEN)
            )
        if a.kind is not None:
            if a.kind not in ALL_KINDS:
                raise InvalidComponentError(
                    f"{what}: argument {a.name!r} has type {a.kind!r}; a component-valued "
                    f"argument names a kind: {one_of(ALL_KINDS)}"
                    + did_you_mean(a.kind, ALL_KINDS)
                )
            if not (a.required or a.default is None or isinstance(a.default, str)):
                raise InvalidComponentError(
                    f"{what}: default of argument {a.name!r} must be spec text naming a "
                    f'{a.kind} (e.g. {a.name}="name" or "name(arg=1)") or None, '
                    f"got {a.default!r}"
                )
            seen.add(a.name)
            continue
        if a.type not in _ARG_TYPES:
            raise InvalidComponentError(
                f"{what}: argument {a.name!r} has type {a.type!r}; use int, float, bool, str "
                f"or a component kind ({one_of(ALL_KINDS)})"
            )
        if not a.required:
            try:
                a.check(a.default)
            except ValueProblem as e:
                raise InvalidComponentError(
                    f"{what}: default of argument {a.name!r} is invalid: it {e}"
                ) from None
        seen.add(a.name)
    for fn_name in ("build", "params", "flops", *OPTIONAL_DECLARATIONS):
        fn = getattr(c, fn_name)
        try:
            fn is None or inspect.signature(fn)
        except (TypeError, ValueError):  # what inspect.signature raises for such a callable
            raise InvalidComponentError(
                f"{what}: {fn_name} {fn!r} has no signature lmcore can read; wrap it in a function"
            ) from None
    accepted = accepted_kwargs(c.build, {a.name: None for a in c.args})
    missing = [a.name for a in c.args if a.name not in accepted]
    if missing:
        raise InvalidComponentError(
            f"{what}: build {getattr(c.build, '__qualname__', c.build)!r} does not accept "
            f"declared argument(s) {', '.join(missing)}"
        )
    return c


def _check_arg_fields(what: str, a: Arg) -> None:
    """Each field of an `Arg` has the type its docstring promises."""
    if not isinstance(a.name, str):
        raise InvalidComponentError(
            f"{what}: an argument's name must be a string, got {type(a.name).__name__} {a.name!r}"
        )
    if not isinstance(a.help, str):
        raise InvalidComponentError(f"{what}: help of argument {a.name!r} must be a string")
    for bound in ("gt", "ge"):
        value = getattr(a, bound)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidComponentError(
                f"{what}: bound {bound} of argument {a.name!r} must be a number or None, "
                f"got {value!r}"
            )
    if a.choices is not None and (
        not isinstance(a.choices, tuple | list) or not all(isinstance(x, str) for x in a.choices)
    ):
        raise InvalidComponentError(
            f"{what}: choices of argument {a.name!r} must be a tuple of strings, got {a.choices!r}"
        )


def validate_preset(item: object) -> Preset:
    if not isinstance(item, Preset):
        raise InvalidComponentError(
            f"lmcore_presets() must return lmcore.Preset objects, got {type(item).__name__}"
        )
    if not isinstance(item.name, str) or not NAME_RE.match(item.name):
        raise InvalidComponentError(f"preset name {item.name!r} is not a valid name")
    if not isinstance(item.spec, str):
        raise InvalidComponentError(f"preset {item.name!r}: spec must be a string")
    return item
