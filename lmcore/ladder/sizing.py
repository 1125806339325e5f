"""A ladder's sizes, from the declarations: each rung's widths and depths, tokens and steps.

    plan = size_ladder("vocab_size=2048, context_length=128, d_model=64, num_layers=2, "
                       "num_heads=2", ["pos=nope"], rungs=4, factor=2.0, by="params",
                       tokens_per_param=20, batch_size=16)
    plan.rungs[2].baseline.params     # ≈ 4 × the base's non-embedding parameters
    plan.rungs[2].steps               # ceil(20 · N / (16 · 128))

Rung 0 is the base as given. Rung k aims at the base's measure times `factor**k`, the measure
being `lmcore.train.matching.measure`'s (the numbers `lmcore describe` prints and checks against
the FLOP counter): non-embedding parameters (`params`, Kaplan's N) or training FLOPs per token
(`flops`: three times the forward's, attention and `lm_head` included). A rung keeps the base's
proportions: the width of a head (`d_model / num_heads`, or an explicit `head_dim`), the ratio
of query to key/value heads, `d_ff / d_model` and, as nearly as whole layers allow,
`d_model / num_layers`. Its number of heads is found by bisection for each of the two depths
next to the ideal one, then `d_ff` (in steps of 8 when the base's is a multiple of 8) is
moved to the measure closest to the target; of the two depths the one that comes within
`TOLERANCE` with the proportions nearest the base's is taken. Every candidate is resolved, so
each component validates its own dimensions (RoPE's even head width, a kernel's limits).

Each variant at a rung is the rung's baseline with the variant's items (`lmcore.train.sweep
.plan`, the code `lmcore sweep` runs); with `match`, its `d_ff` is matched to the baseline by
the same measure (`lmcore.train.matching`), and the mismatch that remains is reported.

Tokens per rung: `tokens_per_param` R gives each rung R × N tokens (N: the baseline's
non-embedding parameters), Chinchilla-style; `compute` C gives each rung C / (FLOPs per
token) tokens. Steps are the tokens over the batch (`batch_size × context`), rounded up, and
the tokens a rung trains are those steps' (`Rung.tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import LmcoreError, SpecError, TrainError, did_you_mean
from lmcore.ladder.fits import MIN_RUNGS
from lmcore.registry import Registry
from lmcore.train.matching import MATCH_BY, WHAT, measure

if TYPE_CHECKING:
    from lmcore.train.sweep import Variant

BY: Final = MATCH_BY  # params, flops
TOLERANCE: Final = 0.02  # a rung's measure is within 2 % of its target
MAX_RUNGS: Final = 24
MAX_FACTOR: Final = 1000.0
# Past these a rung is a typo, not a model: refused before any search.
MAX_PARAMS: Final = 10**13
MAX_FLOPS_PER_TOKEN: Final = 6e13
MAX_D_MODEL: Final = 2**17
MAX_LAYERS: Final = 4096
MAX_TOKENS: Final = 10**15
# The keys a ladder chooses itself: a variant may not set them.
SIZED_KEYS: Final = ("d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "d_ff")


class LadderError(TrainError):
    """A ladder cannot be sized or run as asked; the message names the value and the fix."""


@dataclass(frozen=True)
class Size:
    """One model of a rung: its label (`baseline` or the change), the resolved model, its
    non-embedding parameters and training FLOPs per token, its run directories' name, and its
    measure relative to the rung's baseline, minus one (the mismatch matching leaves)."""

    label: str
    change: str
    blueprint: Blueprint
    params: int
    flops_per_token: float
    name: str
    relative: float = 0.0
    note: str = ""  # what --match did to d_ff
    total: int = 0  # every parameter, the embeddings' included (pos=learned's table among them)

    @property
    def shape(self) -> str:
        s = self.blueprint.spec
        heads = (
            f"{s.num_heads}" if s.num_kv_heads == s.num_heads else f"{s.num_heads}/{s.num_kv_heads}"
        )
        return f"d_model {s.d_model}, {s.num_layers} layers, {heads} heads, d_ff {s.d_ff}"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "change": self.change, "spec": str(self.blueprint.spec),
                "params": self.params, "flops_per_token": self.flops_per_token,
                "name": self.name, "relative": self.relative, "note": self.note,
                "total": self.total}  # fmt: skip


@dataclass(frozen=True)
class Rung:
    """One rung: the measure it aims at, its models (the baseline first), its budget."""

    index: int
    target: float
    models: tuple[Size, ...]
    steps: int
    tokens: int  # steps × batch size × context: what each of its runs trains on
    memory: int | None = None  # the largest model's training memory estimate, bytes

    @property
    def baseline(self) -> Size:
        return self.models[0]

    @property
    def compute(self) -> float:
        """The baseline's training FLOPs: FLOPs per token × tokens."""
        return self.baseline.flops_per_token * self.tokens

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "target": self.target, "steps": self.steps,
                "tokens": self.tokens, "compute": self.compute, "memory": self.memory,
                "models": [m.to_json() for m in self.models]}  # fmt: skip


@dataclass(frozen=True)
class LadderPlan:
    """Every rung of a ladder, sized; and how."""

    base: str
    changes: tuple[str, ...]
    by: str
    factor: float
    match: bool
    tokens_per_param: float | None
    compute: float | None
    batch_size: int
    context: int
    rungs: tuple[Rung, ...]

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "factor": self.factor, "match": self.match,
                "tokens_per_param": self.tokens_per_param, "compute": self.compute,
                "batch_size": self.batch_size, "context": self.context,
                "rungs": [r.to_json() for r in self.rungs]}  # fmt: skip


# ------------------------------------------------------------------------------ checks


def check_ladder_options(
    rungs: int, factor: float, by: str, tokens_per_param: float | None, compute: float | None
) -> None:
    """`LadderError` for options no ladder can have, before anything is resolved."""
    if by not in BY:
        raise LadderError(f"--by {by!r}: must be one of {', '.join(BY)}{did_you_mean(by, BY)}")
    if not isinstance(rungs, int) or isinstance(rungs, bool) or not MIN_RUNGS <= rungs <= MAX_RUNGS:
        raise LadderError(
            f"--rungs {rungs}: must be an integer from {MIN_RUNGS} to {MAX_RUNGS} (the power law "
            f"fitted to each variant has {MIN_RUNGS} parameters, so it needs {MIN_RUNGS} sizes; "
            f"{MIN_RUNGS + 1} to predict the largest from the others)"
        )
    if not (isinstance(factor, int | float) and math.isfinite(factor) and 1 < factor <= MAX_FACTOR):
        raise LadderError(
            f"--factor {factor}: must be a number above 1 and at most {MAX_FACTOR:g} (each rung's "
            f"{WHAT[by]} is the one below's times it), e.g. 2"
        )
    if (tokens_per_param is None) == (compute is None):
        raise LadderError(
            "give one of --tokens-per-param R (each rung trains R × its non-embedding "
            "parameters in tokens, e.g. 20) or --compute C (each rung trains C FLOPs)"
        )
    for flag, value in (("--tokens-per-param", tokens_per_param), ("--compute", compute)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise LadderError(f"{flag} {value}: must be a finite number above 0")


def check_changes(changes: Sequence[str]) -> None:
    """`LadderError` (one line, a did-you-mean for an unknown key) for a `--vary` that is not
    one, or that sets a size the ladder chooses."""
    from lmcore.spec import parse_items
    from lmcore.train.variants import split_change

    if not changes:
        raise LadderError("--vary ITEMS is needed: a ladder compares the baseline with variants")
    for change in changes:
        try:
            spec = split_change(change).spec
        except SpecError as e:
            raise LadderError(e.message) from None
        for item in parse_items(spec) if spec else ():
            if item.key in SIZED_KEYS:
                raise LadderError(
                    f"--vary {change!r} sets {item.key}, which the ladder chooses at every rung "
                    f"({', '.join(SIZED_KEYS)}); vary something else, or put it in the base"
                )


# ------------------------------------------------------------------------------ sizing


@dataclass(frozen=True)
class _Proportions:
    """What every rung keeps of the base."""

    width: float  # d_model per head
    explicit_head_dim: int  # the base's head_dim when it is not d_model / num_heads, else 0
    group: int  # query heads per key/value head
    ff_ratio: float  # d_ff / d_model
    ff_unit: int  # d_ff's step
    aspect: float  # d_model / num_layers


def _proportions(bp: Blueprint) -> _Proportions:
    s = bp.spec
    if s.layers:
        keys = sorted({lv.key for lv in s.layers})
        raise LadderError(
            f"the base sets {', '.join(keys)} per layer; a ladder changes num_layers, so it "
            "scales models whose layers are alike: give the base without per-layer values"
        )
    explicit = s.head_dim if s.head_dim * s.num_heads != s.d_model else 0
    return _Proportions(
        width=s.d_model / s.num_heads,
        explicit_head_dim=explicit,
        group=s.num_heads // s.num_kv_heads,
        ff_ratio=s.d_ff / s.d_model,
        ff_unit=8 if s.d_ff % 8 == 0 else 1,
        aspect=s.d_model / s.num_layers,
    )


def _sized_spec(canonical: str, shape: dict[str, int]) -> str:
    """The canonical spec `canonical` with the keys of `shape` in place of its own."""
    from lmcore.spec import parse_items

    kept = [canonical[i.start : i.value.end] for i in parse_items(canonical) if i.key not in shape]
    return ", ".join([*kept, *(f"{k}={v}" for k, v in shape.items())])


class _Search:
    """Candidates of one base, resolved and measured once each."""

    def __init__(self, bp: Blueprint, by: str, registry: Registry | None):
        self.canonical, self.by, self.registry = str(bp.spec), by, registry
        self.p = _proportions(bp)
        self.cache: dict[tuple[int, int, int], tuple[float, Blueprint] | None] = {}

    def shape(self, heads: int, layers: int, d_ff: int | None = None) -> tuple[int, int, int]:
        d_model = max(1, round(heads * self.p.width))
        if d_ff is None:
            unit = self.p.ff_unit
            d_ff = max(unit, unit * round(self.p.ff_ratio * d_model / unit))
        return heads, layers, d_ff

    def at(self, key: tuple[int, int, int]) -> tuple[float, Blueprint] | None:
        """The measure and model of `key` (heads, layers, d_ff); None when a component refuses
        those dimensions."""
        if key not in self.cache:
            heads, layers, d_ff = key
            shape = {"d_model": max(1, round(heads * self.p.width)), "num_layers": layers,
                     "num_heads": heads, "num_kv_heads": heads // self.p.group,
                     "d_ff": d_ff}  # fmt: skip
            if self.p.explicit_head_dim:
                shape["head_dim"] = self.p.explicit_head_dim
            try:
                bp = resolve(_sized_spec(self.canonical, shape), self.registry)
                self.cache[key] = (measure(bp, self.by), bp)
            except LmcoreError:  # dimensions this model's components do not take
                self.cache[key] = None
        return self.cache[key]

    def value(self, key: tuple[int, int, int]) -> float:
        found = self.at(key)
        return math.inf if found is None else found[0]


def _closest(f: Callable[[int], float], lo: int, hi: int, target: float) -> int:
    """The integer in [lo, hi] whose (non-decreasing) `f` is closest to `target`."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if f(mid) >= target:
            hi = mid
        else:
            lo = mid
    return min((lo, hi), key=lambda x: (abs(math.log(f(x) / target)) if f(x) > 0 else math.inf, x))


def size_model(
    base: Blueprint, target: float, by: str, registry: Registry | None = None
) -> Blueprint:
    """The model of `base`'s proportions whose measure `by` is closest to `target` (within
    `TOLERANCE`, else `LadderError`); see the module's docstring."""
    search = _Search(base, by, registry)
    p, s = search.p, base.spec
    scale = (target / measure(base, by)) ** (1 / 3)  # a layer's size grows as d_model² × depth
    ideal = max(1.0, s.d_model * scale / p.aspect)
    depths = sorted({max(1, min(MAX_LAYERS, math.floor(ideal))),
                     max(1, min(MAX_LAYERS, math.ceil(ideal)))})  # fmt: skip
    max_groups = max(1, int(MAX_D_MODEL / (p.width * p.group)))
    best: tuple[tuple[bool, float, float], Blueprint] | None = None
    u = p.ff_unit
    for layers in depths:

        def by_groups(g: int, n: int = layers) -> float:
            return search.value(search.shape(g * p.group, n))

        near = _closest(by_groups, 1, max_groups, target)
        for groups in {max(1, near - 1), near, min(max_groups, near + 1)}:
            heads, _, d_ff = search.shape(groups * p.group, layers)

            def by_units(k: int, h: int = heads, n: int = layers) -> float:
                return search.value((h, n, k * u))

            units = _closest(by_units, 1, max(2, 4 * d_ff // u), target)
            found = search.at((heads, layers, units * u))
            if found is None:
                continue
            value, bp = found
            err = abs(value / target - 1)
            aspect = abs(math.log(bp.spec.d_model / layers / p.aspect))
            ratio = abs(math.log(bp.spec.d_ff / bp.spec.d_model / p.ff_ratio))
            score = (err > TOLERANCE, aspect + ratio, err)
            if best is None or score < best[0]:
                best = (score, bp)
    if best is None or best[0][0]:
        got = (
            "no dimensions its components accept"
            if best is None
            else (
                f"the closest is {measure(best[1], by):,.0f} (d_model={best[1].spec.d_model}, "
                f"num_layers={best[1].spec.num_layers})"
            )
        )
        raise LadderError(
            f"no model of the base's proportions has {target:,.0f} {WHAT[by]} within "
            f"{TOLERANCE:.0%}: {got}; choose another --factor or base"
        )
    return best[1]


def size_ladder(
    base: str,
    changes: Sequence[str],
    *,
    rungs: int,
    factor: float,
    by: str = "params",
    tokens_per_param: float | None = None,
    compute: float | None = None,
    batch_size: int = 32,
    context: int | None = None,
    match: bool = True,
    config: Any = None,
    registry: Registry | None = None,
) -> LadderPlan:
    """Size every rung of a ladder of `base` and its variants `changes`; see the module's
    docstring. `config` (`TrainConfig`) checks each variant's recipe as `lmcore sweep` does.
    `LadderError` for options no ladder can have or a rung too large to be a model."""
    from lmcore.train.sweep import plan as sweep_plan

    check_ladder_options(rungs, factor, by, tokens_per_param, compute)
    check_changes(changes)
    bp0 = resolve(base, registry)
    _proportions(bp0)
    m0 = measure(bp0, by)
    top = m0 * factor ** (rungs - 1)
    limit = MAX_PARAMS if by == "params" else MAX_FLOPS_PER_TOKEN
    if top > limit:
        raise LadderError(
            f"--rungs {rungs} --factor {factor:g}: the top rung would have {top:.3g} "
            f"{WHAT[by]} (the base's {m0:,.0f} × {factor:g}^{rungs - 1}), past the {limit:.0e} "
            "no machine trains; lower --rungs or --factor"
        )
    ctx = context or bp0.spec.context_length
    per_step = batch_size * ctx
    out: list[Rung] = []
    for k in range(rungs):
        target = m0 * factor**k
        bp = bp0 if k == 0 else size_model(bp0, target, by, registry)
        variants = sweep_plan(str(bp.spec), list(changes), registry, by if match else None, config)
        models = tuple(_size(v, variants[0]) for v in variants)
        n, fpt = models[0].params, models[0].flops_per_token
        tokens = tokens_per_param * n if tokens_per_param is not None else (compute or 0) / fpt
        if tokens > MAX_TOKENS:
            raise LadderError(
                f"rung {k}: {tokens:.3g} tokens per run is past the {MAX_TOKENS:.0e} no data "
                "set holds; lower --tokens-per-param or --compute"
            )
        steps = max(1, math.ceil(tokens / per_step))
        out.append(Rung(k, target, models, steps, steps * per_step))
    return LadderPlan(base, tuple(changes), by, float(factor), match, tokens_per_param, compute,
                      batch_size, ctx, tuple(out))  # fmt: skip


def _size(v: Variant, baseline: Variant) -> Size:
    from lmcore.model.counting import account
    from lmcore.train.sweep import BASELINE

    params, fpt = int(measure(v.blueprint, "params")), measure(v.blueprint, "flops")
    total = account(v.blueprint).params
    if v.matched is not None:
        relative, note = v.matched.relative, v.matched.note
    elif v.label == BASELINE:
        relative, note = 0.0, ""
    else:
        by_params = params / measure(baseline.blueprint, "params") - 1
        relative, note = by_params, ""
    return Size(v.label, v.change, v.blueprint, params, fpt, v.name, relative, note, total)


# ------------------------------------------------------------------------------ memory


def check_memory(
    plan: LadderPlan,
    device: str,
    *,
    micro_batch: int | None = None,
    max_bytes: int | None = None,
) -> LadderPlan:
    """`plan` with each rung's training memory estimate (`lmcore describe`'s: weights,
    gradients, AdamW's moments, buffers and one micro-batch's activations) for its largest
    model; `LadderError` for the first rung that does not fit in `max_bytes` (default: the
    memory available on `device`; unknown there, e.g. a GPU this machine lacks: not checked)."""
    import torch

    from lmcore.describe import describe
    from lmcore.model.counting import available_memory, format_bytes

    where = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                         "cpu" if device == "auto" else device)  # fmt: skip
    limit = max_bytes if max_bytes is not None else available_memory(where)
    rungs = []
    for rung in plan.rungs:
        need = 0
        for m in rung.models:
            found = describe(m.blueprint, batch=plan.batch_size, seq_len=plan.context,
                             micro_batch=micro_batch)  # fmt: skip
            need = max(need, found.memory.total)
        if limit is not None and need > limit:
            raise LadderError(
                f"rung {rung.index} ({rung.baseline.shape}, {rung.baseline.params:,} "
                f"non-embedding parameters) needs about {format_bytes(need)} to train (AdamW, "
                f"batch {plan.batch_size} × {plan.context}), more than the "
                f"{format_bytes(limit)} available on {where}; lower --rungs or --factor, or "
                "--batch-size (or --micro-batch)"
            )
        rungs.append(replace(rung, memory=need))
    return replace(plan, rungs=tuple(rungs))


# ------------------------------------------------------------------------------ output


def _si(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def plan_markdown(plan: LadderPlan) -> str:
    """The rungs as a Markdown table: each model's shape, N, FLOPs per token, mismatch, and
    the rung's tokens, steps and compute."""
    head = ("rung", "model", "shape", "N", "all params", "FLOPs/token", "vs baseline", "tokens",
            "steps", "compute", "memory")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| ---: | --- | --- |" + " ---: |" * 8]
    from lmcore.model.counting import format_bytes

    for r in plan.rungs:
        for i, m in enumerate(r.models):
            first = i == 0
            vs = "–" if first else m.note or f"{m.relative:+.2%}"
            cells = (str(r.index) if first else "", f"`{m.label}`", m.shape, f"{m.params:,}",
                     f"{m.total:,}", _si(m.flops_per_token), vs, _si(r.tokens) if first else "",
                     f"{r.steps:,}" if first else "",
                     f"{m.flops_per_token * r.tokens:.3g}",
                     format_bytes(r.memory) if first and r.memory is not None else "")  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    how = (f"{plan.tokens_per_param:g} tokens per parameter" if plan.tokens_per_param is not None
           else f"{plan.compute:.3g} FLOPs per run")  # fmt: skip
    span = plan.rungs[-1].compute / plan.rungs[0].compute
    return (
        "\n".join(lines)
        + f"\n\n{len(plan.rungs)} rungs, {WHAT[plan.by]} × {plan.factor:g} per rung; {how}; "
        f"batch {plan.batch_size} × {plan.context} tokens; compute spans {span:.3g}×.\n"
    )
