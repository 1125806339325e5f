"""The rules of a Hugging Face family's table (`lmcore.hf.family.Family.rules`): each reads
some config.json fields into spec values (a `Draft`) and writes them back from a resolved model
(a `SpecView`), so each is written once, for both ways.

    Field     one field, one spec value (or several equal ones)
    Choice    a field whose value picks spec values from a table (`hidden_act: silu`)
    Fixed     a field that must hold what lmcore computes
    Dropout   training-time noise: kept, written back, noted
    Derived   a spec value computed from others, with no field of its own
    Rope      rope_theta, rope_scaling / rope_parameters, a partial rotation
    Window    a sliding window, for all layers or by `layer_types`
    Moe       a mixture of experts and the layers that stay dense

A spec *path* is a model key (`d_model`, `window`) or a component slot and its argument
(`ffn`, `ffn.bias`, `pos.theta`, `qk_norm.eps`); a rule may give one value for the whole model
or a list of per-layer values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from lmcore.components import REQUIRED
from lmcore.hf.draft import OMIT, SLOTS, Draft, Rule, SpecView, paths
from lmcore.hf.values import checked, spread
from lmcore.hf.values import either as _or
from lmcore.hf.values import json_text as _json
from lmcore.hf.values import one_of as _one_of
from lmcore.hf.values import same as _same
from lmcore.hf.values import too_many as _too_many

__all__ = [
    "SLOTS",
    "Choice",
    "Derived",
    "Draft",
    "Dropout",
    "Field",
    "Fixed",
    "Moe",
    "Rope",
    "Rule",
    "SpecView",
    "Window",
    "checked",
    "spread",
]

# ------------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class Field:
    """A config field carried over as one spec value (or several equal ones: `attention_bias`
    is both `qkv_bias` and `out_bias`). `default`: the family's value when the field is absent
    or null (a function of the draft for derived defaults: `num_key_value_heads` defaults to
    the heads); `null`: its value when the config says null, if not the default (a softcap's
    null is none: 0.0); `aliases`: other names transformers accepts for it; `zero`: 0 is
    allowed; `reads`/`writes`: config value -> spec value and back."""

    name: str
    spec: str | tuple[str, ...]
    type: type = int
    default: Any = REQUIRED
    aliases: tuple[str, ...] = ()
    zero: bool = False
    reads: Callable[[Any], Any] | None = None
    writes: Callable[[Any], Any] | None = None
    null: Any = OMIT

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def read(self, d: Draft) -> None:
        given = [(n, d.config[n]) for n in self.fields if d.config.get(n) is not None]
        if len({_json(v) for _, v in given}) > 1:
            shown = " and ".join(f"{n}={_json(v)}" for n, v in given)
            d.problems.append(f"{shown} disagree")
            return
        name = given[0][0] if given else self.name
        nulled = not given and any(n in d.config for n in self.fields)
        value = (
            given[0][1]
            if given
            else self.null
            if nulled and self.null is not OMIT
            else (self.default)
        )
        if callable(value):
            value = value(d)
            if value is None:  # what it derives from was refused already
                return
        if value is REQUIRED:
            d.problems.append(f"{self.name} is missing")
            return
        if value is None:
            return
        value = checked(name, value, self.type, d.problems, zero=self.zero)
        if value is None:
            return
        value = self.reads(value) if self.reads else value
        for path in paths(self.spec):
            d.set(path, value, f"{name}={_json(given[0][1]) if given else _json(value)}")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        value = v.first(paths(self.spec)[0])
        if value is not None:
            out[self.name] = v.keep(self.name, self.writes(value) if self.writes else value)


@dataclass(frozen=True)
class Choice:
    """A config field whose value picks spec values from `table` (`hidden_act: silu` is
    `ffn=swiglu`; `use_parallel_residual: true` is `block=parallel(norms=2)`). A value not in
    the table is refused, naming those it has. Written back: the first entry (or the base
    config's) whose spec values the model has."""

    name: str
    table: Mapping[Any, Mapping[str, Any]]
    default: Any = REQUIRED
    aliases: tuple[str, ...] = ()
    what: str = ""  # what the values are, for the message: "activations"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def read(self, d: Draft) -> None:
        given = [(n, d.config[n]) for n in self.fields if d.config.get(n) is not None]
        if not given and self.default is REQUIRED:
            d.problems.append(f"{self.name} is missing")
        for name, value in given or (
            [(self.name, self.default)]
            if self.default is not REQUIRED and self.default is not None
            else []
        ):
            key = next((k for k in self.table if _same(k, value)), OMIT)
            if key is OMIT:
                what = f" ({self.what})" if self.what else ""
                d.problems.append(
                    f"{name}={_json(value)}: lmcore expresses {_or(self.table)}{what}"
                )
                continue
            for path, spec_value in self.table[key].items():
                d.set(path, spec_value, f"{name}={_json(value)}")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        fits = [
            k
            for k, paths in self.table.items()
            if all(v.first(p) == val for p, val in paths.items())
        ]
        if not fits:
            return  # the read-back names what differs
        base = v.base.get(self.name)
        out[self.name] = next((k for k in fits if _same(k, base)), fits[0])


@dataclass(frozen=True)
class Fixed:
    """A config field that must hold one of `allowed` (absent is fine): what lmcore computes.
    Written back as the base config's value, or `allowed[0]` (left out when `write` is False)."""

    name: str
    allowed: tuple[Any, ...]
    why: str = ""
    write_it: bool = True

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.name,)

    def read(self, d: Draft) -> None:
        if self.name in d.config and not _one_of(d.config[self.name], self.allowed):
            why = self.why or f"lmcore computes {_or(self.allowed)}"
            d.problems.append(f"{self.name}={_json(d.config[self.name])} ({why})")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        base = v.base.get(self.name, OMIT)
        if base is not OMIT and _one_of(base, self.allowed):
            out[self.name] = base
        elif self.write_it:
            out[self.name] = self.allowed[0]


@dataclass(frozen=True)
class Dropout:
    """Dropout (and router jitter): training-only noise, which lmcore's training does not apply.
    Kept and written back; a non-zero value is noted when converting."""

    names: tuple[str, ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return self.names

    def read(self, d: Draft) -> None:
        on = []
        for name in self.names:
            value = d.config.get(name)
            if value is None:
                continue
            if checked(name, value, float, d.problems, zero=True) not in (None, 0.0):
                on.append(f"{name}={_json(value)}")
        if on:
            d.notes.append(
                f"{', '.join(on)}: training-time noise, which lmcore's training does not apply "
                "(kept in the checkpoint's metadata and written back; inference is unchanged)"
            )

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        for name in self.names:
            if name in v.base:
                out[name] = v.base[name]


@dataclass(frozen=True)
class Derived:
    """A spec value computed from others, with no config field of its own (Gemma's embedding
    scale `sqrt(hidden_size)`). Nothing to write: the read-back checks it."""

    path: str
    compute: Callable[[Mapping[str, Any]], Any]

    @property
    def fields(self) -> tuple[str, ...]:
        return ()

    def read(self, d: Draft) -> None:
        try:
            value = self.compute(d.values)
        except (KeyError, TypeError):
            return  # what it derives from was refused already
        d.set(self.path, value, "the family")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        return None


# The rotary scalings lmcore's rope computes, and the arguments each reads from a rope dict.
_ROPE_ARGS: Final[Mapping[str, Mapping[str, tuple[str, type]]]] = {
    "default": {},
    "linear": {"factor": ("factor", float)},
    "llama3": {
        "factor": ("factor", float),
        "low_freq_factor": ("low_freq_factor", float),
        "high_freq_factor": ("high_freq_factor", float),
        "original_max_position_embeddings": ("original_context_length", int),
    },
    "yarn": {
        "factor": ("factor", float),
        "original_max_position_embeddings": ("original_context_length", int),
        "beta_fast": ("beta_fast", float),
        "beta_slow": ("beta_slow", float),
        "truncate": ("truncate", bool),
        "attention_factor": ("attention_factor", float),
        "mscale": ("mscale", float),
        "mscale_all_dim": ("mscale_all_dim", float),
    },
}
# The rope parameters a scaling may leave out (or null), and what transformers takes then;
# written back only when they differ from it.
_ROPE_OPTIONAL: Final[Mapping[str, Mapping[str, Any]]] = {
    "yarn": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        "attention_factor": 0.0,
        "mscale": 0.0,
        "mscale_all_dim": 0.0,
    },
}


@dataclass(frozen=True)
class Rope:
    """Rotary embeddings: `rope_theta` (or the family's names for it) and `rope_scaling`
    (transformers 4) or `rope_parameters` (transformers 5) to `pos=rope(theta=..., fraction=...,
    scaling=...)`. `fraction_names`: the partial-rotary field, for families that rotate part of
    each head (GPT-NeoX's `rotary_pct`, Phi-3's `partial_rotary_factor`); without one, a
    fraction other than 1 is refused. Scalings other than `linear`, `llama3` and `yarn`
    (dynamic, longrope, ...) are refused by name. Written in transformers 4's form, which 4 and
    5 read."""

    theta: float = 10000.0
    theta_names: tuple[str, ...] = ("rope_theta",)
    fraction: float = 1.0
    fraction_names: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        return (*self.theta_names, *self.fraction_names, "rope_scaling", "rope_parameters")

    def read(self, d: Draft) -> None:
        problems = d.problems
        params: dict[str, Any] = {}
        origin: dict[str, str] = {}  # where each parameter was given: "rope_parameters.factor"
        for name in ("rope_scaling", "rope_parameters"):
            given = d.config.get(name)
            if given is None:
                continue
            if not isinstance(given, dict):
                problems.append(f"{name}={_json(given)} is not an object")
                return
            if given and all(isinstance(x, dict) for x in given.values()):
                problems.append(
                    f"{name}={_json(given)}: rotary parameters per layer type (lmcore's rope "
                    "is one per layer or model, given in the spec)"
                )
                return
            for key, value in given.items():
                key = "rope_type" if key == "type" else key
                if key in params and not _same(params[key], value):
                    problems.append(f"rope_scaling and rope_parameters disagree on {key}")
                params[key] = value
                origin.setdefault(key, f"{name}.{key}")
        kind = params.pop("rope_type", "default")
        if kind not in _ROPE_ARGS:
            problems.append(
                f"rope type {_json(kind)}: lmcore's rope scales frequencies by none "
                '("default"), "linear", "llama3" or "yarn"'
            )
            return
        theta = self._top(d, self.theta_names)
        fraction = self._top(d, self.fraction_names)
        for key, top in (("rope_theta", theta), ("partial_rotary_factor", fraction)):
            if key in params and top is not None and not _same(params[key], top[1]):
                problems.append(
                    f"{top[0]}={_json(top[1])} and rope {key}={_json(params[key])} disagree"
                )
        theta_value = params.pop("rope_theta", theta[1] if theta else self.theta)
        fraction_value = params.pop("partial_rotary_factor", fraction[1] if fraction else None)
        theta_name = origin.get("rope_theta", theta[0] if theta else "rope_theta")
        args: dict[str, Any] = {"theta": checked(theta_name, theta_value, float, problems)}
        if fraction_value is not None:
            fraction_name = origin.get(
                "partial_rotary_factor", fraction[0] if fraction else "partial_rotary_factor"
            )
            f = checked(fraction_name, fraction_value, float, problems)
            if f is not None and f != 1.0 and not self.fraction_names:
                problems.append(
                    f"partial_rotary_factor={_json(fraction_value)}: this family's attention "
                    "rotates every dimension of each head"
                )
            elif f is not None and f > 1.0:
                problems.append(f"partial_rotary_factor={_json(fraction_value)} is above 1")
            elif f is not None:
                args["fraction"] = f
        elif self.fraction != 1.0:
            args["fraction"] = self.fraction
        wanted = _ROPE_ARGS[kind]
        if kind != "default":
            args["scaling"] = kind
            if kind == "llama3" and "original_max_position_embeddings" not in params:
                fallback = d.field(
                    "original_max_position_embeddings", d.field("max_position_embeddings")
                )
                params["original_max_position_embeddings"] = fallback
            optional = _ROPE_OPTIONAL.get(kind, {})
            for key, (arg, kind_of) in wanted.items():
                if params.get(key) is None:
                    params.pop(key, None)
                    if key in optional:
                        args[arg] = optional[key]
                    else:
                        problems.append(f"rope {kind} scaling without {key}")
                    continue
                zero = key in optional and not optional[key]  # 0 there is the default's
                args[arg] = checked(
                    origin.get(key, key), params.pop(key), kind_of, problems, zero=zero
                )
        extra = sorted(k for k in params if k not in wanted)
        if extra:
            problems.append(
                f"rope parameters {', '.join(f'{k}={_json(params[k])}' for k in extra)}: "
                f"lmcore's rope with {_json(kind)} scaling reads none of them"
            )
        for arg, value in args.items():
            if value is not None:
                d.set(f"pos.{arg}", value, "the rotary parameters")

    @staticmethod
    def _top(d: Draft, names: tuple[str, ...]) -> tuple[str, Any] | None:
        return next(((n, d.config[n]) for n in names if d.config.get(n) is not None), None)

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        if v.first("pos") != "rope":
            return  # the read-back names it
        theta = v.first("pos.theta")
        out[self.theta_names[0]] = v.keep(self.theta_names[0], theta)
        if self.fraction_names:
            out[self.fraction_names[0]] = v.first("pos.fraction")
        scaling = v.first("pos.scaling")
        if scaling in (None, "none"):
            out["rope_scaling"] = None
            return
        rope: dict[str, Any] = {"rope_type": scaling}
        optional = _ROPE_OPTIONAL.get(scaling, {})
        for key, (arg, _) in _ROPE_ARGS.get(scaling, {}).items():
            value = v.first(f"pos.{arg}")
            if key not in optional or value != optional[key]:
                rope[key] = value
        out["rope_scaling"] = rope


SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Window:
    """A sliding window: `sliding_window` (null: none) for every layer, or for those whose
    `layer_types` entry is "sliding_attention" (`layer_types`; absent, `default_types` says
    which); `gate`: a field that must be true for the window to apply (Qwen's
    `use_sliding_window`). `default`: the family's window when `sliding_window` is absent."""

    default: int | None = None
    gate: str | None = None
    layer_types: bool = False
    # the layers that slide: a range, or one flag per layer (Gemma 3's `sliding_window_pattern`)
    default_types: Callable[[Draft, int], range | Sequence[bool]] | None = None
    reads: tuple[str, ...] = ()  # fields default_types reads ("max_window_layers")

    @property
    def fields(self) -> tuple[str, ...]:
        names = ("sliding_window", *((self.gate,) if self.gate else ()), *self.reads)
        return (*names, "layer_types") if self.layer_types else names

    def read(self, d: Draft) -> None:
        n = d.num_layers
        window = d.config.get("sliding_window", self.default)
        if window is not None:
            window = checked("sliding_window", window, int, d.problems, zero=True)
        if self.gate is not None:
            on = d.config.get(self.gate, False)
            if checked(self.gate, on, bool, d.problems) is False:
                window = None
        if n is None:
            return
        slides: range | Sequence[bool] = range(n)
        if self.layer_types:
            types = d.config.get("layer_types")
            if types is None:
                slides = self.default_types(d, n) if self.default_types else range(n)
            elif (  # the length first: a list of n entries is as long as the file says
                not isinstance(types, list)
                or len(types) != n
                or not all(t in (SLIDING, FULL) for t in types)
            ):
                d.problems.append(
                    f"layer_types={_json(types)}: lmcore reads a list of {n:,} "
                    f'"{SLIDING}" or "{FULL}"'
                )
                return
            else:
                slides = [t == SLIDING for t in types]
        if not window:  # no window on any layer, whichever the types say
            d.set("window", 0, "sliding_window")
            return
        on = spread(n, slides)
        if on is None:
            d.problems.append(_too_many(n, f"sliding_window={window}"))
        elif isinstance(on, bool):
            d.set("window", window if on else 0, "sliding_window")
        else:
            d.set("window", [window if s else 0 for s in on], "sliding_window")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        windows = v.layers("window")
        sizes = sorted({w for w in windows if w})
        size = sizes[0] if sizes else None
        if self.gate is not None:
            out[self.gate] = size is not None
        if size is None and (self.gate is not None or self.layer_types):
            size = v.base.get("sliding_window", self.default)  # kept, unused
        out["sliding_window"] = size
        if self.layer_types:
            out["layer_types"] = [SLIDING if w else FULL for w in windows]
        for name in self.reads:  # a default pattern's field: the first sliding layer
            first = next((i for i, w in enumerate(windows) if w), v.n)
            if sizes and all(windows[first:]):
                out[name] = first
            elif name in v.base:
                out[name] = v.base[name]


@dataclass(frozen=True)
class Moe:
    """A mixture of experts (Mixtral, Qwen3-MoE) to `ffn=moe(num_experts, top_k, renormalize,
    aux_loss_coef)` with SwiGLU experts `d_ff` wide: `experts` and `top_k` the fields, the
    experts' width `d_ff` (absent: `intermediate_size`), `renormalize` a field
    (`norm_topk_prob`) or the family's constant; `dense` (`mlp_only_layers`) and `step`
    (`decoder_sparse_step`) pick layers that keep a dense SwiGLU `intermediate_size` wide
    (`ffn[...]=swiglu, d_ff[...]=...`). The load-balancing loss is transformers' only with
    `output_router_logits` true, so `aux_loss_coef` is `router_aux_loss_coef` then, else 0."""

    experts: tuple[str, ...] = ("num_local_experts", "num_experts")
    experts_default: int = 8
    top_k_default: int = 2
    renormalize: str | bool = True
    renormalize_default: bool = False
    d_ff: str | None = None
    dense: str | None = None
    step: str | None = None
    aux_default: float = 0.001

    @property
    def fields(self) -> tuple[str, ...]:
        names = [
            *self.experts,
            "num_experts_per_tok",
            "intermediate_size",
            "router_aux_loss_coef",
            "output_router_logits",
        ]
        names += [x for x in (self.d_ff, self.dense, self.step) if x]
        names += [self.renormalize] if isinstance(self.renormalize, str) else []
        return tuple(names)

    def read(self, d: Draft) -> None:
        p = d.problems
        given = [(n, d.config[n]) for n in self.experts if d.config.get(n) is not None]
        if len({_json(v) for _, v in given}) > 1:
            p.append(" and ".join(f"{n}={_json(v)}" for n, v in given) + " disagree")
        experts = checked(
            given[0][0] if given else self.experts[0],
            given[0][1] if given else self.experts_default,
            int,
            p,
        )
        top_k = checked(
            "num_experts_per_tok", d.field("num_experts_per_tok", self.top_k_default), int, p
        )
        dense_width = checked("intermediate_size", d.field("intermediate_size", REQUIRED), int, p)
        width = dense_width
        if self.d_ff is not None:
            width = checked(self.d_ff, d.field(self.d_ff, REQUIRED), int, p)
        renorm: Any = self.renormalize
        if isinstance(renorm, str):
            renorm = checked(renorm, d.field(renorm, self.renormalize_default), bool, p)
        coef = checked(
            "router_aux_loss_coef",
            d.field("router_aux_loss_coef", self.aux_default),
            float,
            p,
            zero=True,
        )
        if (
            checked("output_router_logits", d.field("output_router_logits", False), bool, p)
            is False
        ):
            coef = 0.0
        n = d.num_layers
        dense: Any = d.field(self.dense, []) if self.dense else []
        if not isinstance(dense, list) or not all(type(i) is int for i in dense):
            p.append(f"{self.dense}={_json(dense)} is not a list of layer indices")
            dense = []
        step = checked(self.step, d.field(self.step, 1), int, p) if self.step else 1
        if None in (experts, top_k, dense_width, width, renorm, coef, step) or n is None:
            return
        sparse = spread(n, range(step - 1, n, step), but=dense)  # every step-th layer
        if sparse is None:
            d.problems.append(_too_many(n, "experts"))
            return

        def by_layer(yes: Any, no: Any) -> Any:
            if isinstance(sparse, bool):
                return yes if sparse else no
            return [yes if s else no for s in sparse]

        d.set("ffn", by_layer("moe", "swiglu"), "num_local_experts")
        d.set("d_ff", by_layer(width, dense_width), "intermediate_size")
        for arg, value in (
            ("num_experts", experts),
            ("top_k", top_k),
            ("renormalize", renorm),
            ("aux_loss_coef", coef),
        ):
            d.set(f"ffn.{arg}", by_layer(value, None), "the router")

    def write(self, v: SpecView, out: dict[str, Any]) -> None:
        ffns, widths = v.layers("ffn"), v.layers("d_ff")
        sparse = [f == "moe" for f in ffns]
        if not any(sparse):  # read back as experts, so the difference is named by the ffn
            out["intermediate_size"] = widths[0]
            if self.d_ff is not None:
                out[self.d_ff] = widths[0]
            return
        out[self.experts[0]] = v.first("ffn.num_experts")
        out["num_experts_per_tok"] = v.first("ffn.top_k")
        if isinstance(self.renormalize, str):
            out[self.renormalize] = v.first("ffn.renormalize")
        coef = v.first("ffn.aux_loss_coef")
        out["output_router_logits"] = bool(coef)
        out["router_aux_loss_coef"] = (
            coef if coef else v.base.get("router_aux_loss_coef", self.aux_default)
        )
        moe_width = next(w for w, s in zip(widths, sparse, strict=True) if s)
        dense_widths = [w for w, s in zip(widths, sparse, strict=True) if not s]
        if self.d_ff is None:
            out["intermediate_size"] = moe_width
        else:
            out[self.d_ff] = moe_width
            out["intermediate_size"] = (
                dense_widths[0] if dense_widths else v.base.get("intermediate_size", moe_width)
            )
        if self.dense:
            out[self.dense] = [i for i, s in enumerate(sparse) if not s]
        if self.step:
            out[self.step] = 1
