"""The training recipe's contracts: an optimizer or a schedule, built as `lmcore train` builds
it (`lmcore.train.recipe`), held to what the runner relies on.

An optimizer is built over a small model's parameter groups by role (`param_groups` over
`roles_of`, from the registry's default components: embedding, matrices, gains, head) with the
runner's offer, and, as the runner does before every step, each group's ``lr`` is set to the
step's rate times its ``lr_scale``:

- `groups`: it holds every parameter once, keeps each group's keys (role, lr_scale, ...), and
  after one step with nonzero gradients every parameter has moved (none without an update rule);
- `lr`: a group whose ``lr`` the runner sets to 0 does not move, one set above 0 does (the check
  runs with weight decay off, so lr 0 means no change at all);
- `resume`: its state dict, through the checkpoint's own flattening (tensors, and JSON for the
  rest), loads into a fresh optimizer, and the steps after are bit for bit those of the run that
  never stopped;
- `quadratic`: steps on ``f = Σ ½‖W A − B‖²`` over the parameters decrease it;
- `bfloat16`: steps on a bfloat16 model leave parameters (still bfloat16) and state finite.

A schedule is built at several (steps, warmup, decay_steps) and called at every step the runner
asks for (0 … steps, and a few beyond, where a resumed run trains on):

- `values`: a finite real number ≥ 0 and ≤ the peak `lr`; `edges`: the same for steps=1,
  warmup=0 and warmup=steps; `warmup`: it rises over the warmup, below the peak, and is at the
  peak when the warmup ends; `pure`: a function of the step alone (same step, same value, in any
  order of calls, from either of two built alike).

Every failure message names the component, the distribution it comes from and what is wrong.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor, nn

from lmcore.components import format_scalar
from lmcore.errors import LmcoreError
from lmcore.parts import Part
from lmcore.testing.core import Settings, Target, check, fail, first_line, model_buildable

# The probe model: the registry's default components at a small shape, untied (so that the
# embedding and the head are two roles).
SPEC: Final = (
    "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64, "
    "tie_embeddings=false"
)
VOCAB: Final = 97
LR: Final = 1e-2
# A learning-rate multiplier on one role, so that a group's lr differs from the peak.
ROLE_LR: Final = {"gain": 0.5}
# The keys every group the runner hands over has, and an optimizer keeps (`param_groups`).
GROUP_KEYS: Final = ("lr", "lr_scale", "weight_decay", "role", "fan_in", "fan_out", "splits")
STEPS_BEFORE, STEPS_AFTER = 3, 3  # resume: steps before the checkpoint, and after it
QUADRATIC_STEPS: Final = 10
BF16_STEPS: Final = 5
# Schedules: (steps, warmup, decay_steps, min_lr as a fraction of lr), as the runner builds them
# (0 ≤ warmup ≤ decay_steps); the edges apart.
SCHEDULES: Final = ((100, 10, 100, 0.1), (100, 0, 100, 0.1), (60, 6, 45, 0.0), (10, 1, 10, 0.1))
EDGES: Final = ((1, 0, 1, 0.1), (1, 1, 1, 0.1), (8, 8, 8, 0.1), (8, 0, 8, 0.0))
BEYOND: Final = 3  # steps past the end a schedule is also asked for


# ------------------------------------------------------------------------------ shared


def spec_text(target: Target) -> str:
    """``adafactor(relative_step=true)``: the target as `--optimizer` / `--schedule` names it."""
    name = target.entry.name
    if target.qualified:
        name = f"{target.entry.provenance.qualifier}:{name}"
    args = ",".join(f"{k}={format_scalar(v)}" for k, v in target.overrides)
    return name + (f"({args})" if args else "")


def who(target: Target) -> str:
    """``optimizer 'adamw' from lmcore-registry 0.1.0 (plugin 'adamw', module lmcore_adamw)``."""
    return f"{target.kind} {spec_text(target)!r} from {target.entry.provenance}"


def part_of(target: Target) -> Part:
    from lmcore.train.recipe import resolve_recipe

    try:
        return resolve_recipe(target.kind, spec_text(target), target.registry)
    except LmcoreError as e:
        fail(f"{who(target)}: {spec_text(target)!r} does not resolve: {first_line(e)}")


def probe(target: Target, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The probe model, seeded: the same weights every time it is built."""
    from lmcore.model.transformer import build_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        return build_model(SPEC, dtype=dtype, registry=target.registry)


def batches(n: int) -> list[Tensor]:
    gen = torch.Generator().manual_seed(5678)
    return [torch.randint(0, VOCAB, (2, 9), generator=gen) for _ in range(n)]


def make(
    target: Target, model: nn.Module, *, weight_decay: float | None = None
) -> tuple[torch.optim.Optimizer, list[dict[str, Any]], list[list[str]]]:
    """The optimizer over `model`'s role groups, as `lmcore train` builds it (the run's default
    betas, eps and weight decay unless `weight_decay` is given): it, the groups it was handed
    and the parameter names of each of its own groups."""
    from lmcore.model.roles import roles_of
    from lmcore.train.config import TrainConfig, decay_roles
    from lmcore.train.optim import group_names
    from lmcore.train.recipe import build_optimizer, param_groups

    part, default = part_of(target), TrainConfig()
    decay = default.weight_decay if weight_decay is None else weight_decay
    groups, _ = param_groups(model, roles_of(model), decay=decay_roles(default.decay),
                             weight_decay=decay, lr=LR, multipliers=ROLE_LR)  # fmt: skip
    try:
        opt = build_optimizer(part, groups, lr=LR, weight_decay=decay, betas=default.betas,
                              eps=default.eps)  # fmt: skip
        names = group_names(model, opt, part)
    except LmcoreError as e:
        fail(f"{who(target)}: {first_line(e)}")
    for i, g in enumerate(opt.param_groups):
        missing = [k for k in GROUP_KEYS if k not in g]
        if missing:
            fail(
                f"{who(target)}: its param_groups[{i}] lacks {missing} (it has {sorted(g)}); "
                "keep the keys of the groups the runner hands over: it sets each group's lr to "
                "the schedule's value times the group's lr_scale before every step"
            )
    return opt, groups, names


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """What the runner does before each step."""
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_scale"]


def step(target: Target, opt: torch.optim.Optimizer, when: str) -> None:
    try:
        opt.step()
    except Exception as e:  # a plugin's fault, whatever it is
        fail(f"{who(target)}: its step() {when} raised {type(e).__name__}: {first_line(e)}")


def train(
    target: Target,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    tokens: Sequence[Tensor],
    lrs: Sequence[float],
    when: str = "",
) -> None:
    """One step per batch of `tokens` at the rates `lrs`, on the language-model loss."""
    from lmcore.model.nn import cross_entropy

    for i, (batch, lr) in enumerate(zip(tokens, lrs, strict=True)):
        set_lr(opt, lr)
        opt.zero_grad(set_to_none=True)
        cross_entropy(model(batch[:, :-1]), batch[:, 1:]).backward()
        step(target, opt, f"{when}(step {i + 1})")


def random_gradients(model: nn.Module) -> None:
    """A nonzero gradient for every element of every parameter."""
    gen = torch.Generator().manual_seed(91)
    for p in model.parameters():
        g = torch.randn(p.shape, generator=gen)
        p.grad = (g + torch.where(g >= 0, 0.1, -0.1)).to(p.dtype)


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def role_of(names: list[list[str]], opt: torch.optim.Optimizer) -> dict[str, str]:
    return {
        n: str(g.get("role")) for g, row in zip(opt.param_groups, names, strict=True) for n in row
    }


def shown(names: Sequence[str], limit: int = 4) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


# ------------------------------------------------------------------------------ optimizer


@check("groups", ("optimizer",), needs=model_buildable)
def groups(target: Target, variant: str, settings: Settings) -> None:
    """It holds every parameter the runner hands it once, in groups that keep their keys (role,
    lr_scale, ...) and their role's values, and after one step with nonzero gradients every
    parameter has changed: none is left without an update rule."""
    model = probe(target)
    opt, given, names = make(target, model, weight_decay=0.0)
    origin = {id(p): g for g in given for p in g["params"]}
    for i, g in enumerate(opt.param_groups):
        for key in ("role", "lr_scale"):
            theirs = {repr(origin[id(p)][key]) for p in g["params"]}
            if theirs - {repr(g[key])}:
                fail(
                    f"{who(target)}: its param_groups[{i}] says {key}={g[key]!r} but holds "
                    f"parameters the runner gave with {key} {sorted(theirs)}; keep the "
                    "parameters of one role in groups of that role (split a group, never merge "
                    "roles), so that per-role learning rates and weight decay still apply"
                )
    before = snapshot(model)
    random_gradients(model)
    set_lr(opt, LR)
    step(target, opt, "with nonzero gradients")
    roles = role_of(names, opt)
    still = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    if still:
        kinds = sorted({roles[n] for n in still})
        fail(
            f"{who(target)}: after a step with a nonzero gradient for every element, "
            f"{len(still)} parameter(s) did not change: {shown(still)} (role(s) "
            f"{', '.join(kinds)}); every parameter in every group needs an update rule (a "
            "group skipped in step(), or a role with no rule, leaves them untrained)"
        )


@check("lr", ("optimizer",), needs=model_buildable)
def lr(target: Target, variant: str, settings: Settings) -> None:
    """It steps each group at the ``lr`` the runner sets on that group before the step: a group
    set to 0 does not move, one set above 0 does (weight decay off, so 0 means no change)."""
    for parity in (0, 1):
        model = probe(target)
        opt, _, names = make(target, model, weight_decay=0.0)
        before = snapshot(model)
        random_gradients(model)
        set_lr(opt, LR)
        for i, g in enumerate(opt.param_groups):
            if i % 2 == parity:
                g["lr"] = 0.0
        step(target, opt, "with some groups' lr set to 0")
        now = dict(model.named_parameters())
        for i, (g, row) in enumerate(zip(opt.param_groups, names, strict=True)):
            moved = [n for n in row if not torch.equal(now[n], before[n])]
            if i % 2 == parity and moved:
                fail(
                    f"{who(target)}: the runner set param_groups[{i}]['lr'] (role "
                    f"{g['role']!r}) to 0, yet {shown(moved)} changed; step each group at its "
                    "own group['lr'], read in step() (the runner sets it before every step)"
                )
            if i % 2 != parity and row and not moved:
                fail(
                    f"{who(target)}: the runner set param_groups[{i}]['lr'] (role "
                    f"{g['role']!r}) to {g['lr']:g}, yet none of its parameters moved while "
                    "other groups' lr was 0: step every group at its own group['lr'], read in "
                    "step() (not the defaults, another group's or a value kept from "
                    "construction)"
                )


@check("resume", ("optimizer",), needs=model_buildable)
def resume(target: Target, variant: str, settings: Settings) -> None:
    """Its state dict round trips through a checkpoint (tensors, and JSON for the rest) into a
    fresh optimizer, and the steps after resuming equal bit for bit those of the run that never
    stopped."""
    from lmcore.train.state import flatten_optimizer, unflatten_optimizer

    tokens = batches(STEPS_BEFORE + STEPS_AFTER)
    lrs = [LR * (1 - 0.1 * t) for t in range(len(tokens))]  # a schedule's changing rate
    model = probe(target)
    opt, _, names = make(target, model)
    train(target, model, opt, tokens[:STEPS_BEFORE], lrs[:STEPS_BEFORE])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    saved = copy.deepcopy(opt.state_dict())
    tensors, rest = flatten_optimizer(opt.state_dict(), names)
    try:
        rest = json.loads(json.dumps(rest))
    except (TypeError, ValueError) as e:
        fail(
            f"{who(target)}: its state_dict() cannot be written to a checkpoint ({e}): keep "
            "per-parameter state as tensors and everything else as JSON values (numbers, "
            "strings, lists, dicts)"
        )
    tensors = {k: v.clone() for k, v in tensors.items()}
    train(target, model, opt, tokens[STEPS_BEFORE:], lrs[STEPS_BEFORE:])

    fresh = probe(target)
    fresh.load_state_dict(weights)
    again, _, again_names = make(target, fresh)
    try:
        again.load_state_dict(unflatten_optimizer(tensors, rest, again_names, Path("<kit>")))
    except Exception as e:  # a plugin's fault, whatever it is
        fail(f"{who(target)}: load_state_dict() of its own state_dict() raised {first_line(e)}")
    problem = state_difference(saved, again.state_dict())
    if problem:
        fail(
            f"{who(target)}: state_dict() → load_state_dict() into a fresh optimizer does not "
            f"round trip: {problem}; a resumed run must start from exactly the state it saved"
        )
    train(target, fresh, again, tokens[STEPS_BEFORE:], lrs[STEPS_BEFORE:], "after resuming ")
    resumed = dict(fresh.named_parameters())
    for n, p in model.named_parameters():
        if not torch.equal(resumed[n], p):
            diff = float((resumed[n].detach().float() - p.detach().float()).abs().max())
            fail(
                f"{who(target)}: {STEPS_AFTER} steps after resuming from its state_dict() are "
                f"not those of the run that never stopped: {n!r} differs by up to {diff:.3g}; "
                "keep in state_dict() everything step() reads (moments, step counts), and make "
                "load_state_dict() restore it"
            )


def state_difference(saved: dict[str, Any], loaded: dict[str, Any]) -> str | None:
    """Where `loaded` (a fresh optimizer's state dict after loading `saved`) differs from it."""
    # A parameter with empty state (none yet, or none kept) is the same as one without.
    a = {i: s for i, s in saved["state"].items() if s}
    b = {i: s for i, s in loaded["state"].items() if s}
    if sorted(a) != sorted(b):
        return f"state for parameters {sorted(a)} came back for {sorted(b)}"
    for index in a:
        if sorted(a[index]) != sorted(b[index]):
            return f"parameter {index}'s state {sorted(a[index])} came back as {sorted(b[index])}"
        for key, value in a[index].items():
            other = b[index][key]
            if isinstance(value, Tensor):
                same = isinstance(other, Tensor) and torch.equal(value, other.to(value.dtype))
            else:
                same = value == other
            if not same:
                return f"parameter {index}'s {key!r} changed"
    return None


@check("quadratic", ("optimizer",), needs=model_buildable)
def quadratic(target: Target, variant: str, settings: Settings) -> None:
    """Steps on a quadratic over every parameter, f = Σ ½‖W A − B‖² (each parameter W as a
    matrix, A well conditioned), decrease it."""
    model = probe(target)
    opt, _, _ = make(target, model, weight_decay=0.0)
    gen = torch.Generator().manual_seed(17)
    terms: list[tuple[Tensor, Tensor, Tensor]] = []
    for p in model.parameters():
        n = p.shape[-1] if p.ndim else 1
        rows = p.numel() // n
        a = torch.eye(n) + 0.2 * torch.randn(n, n, generator=gen) / math.sqrt(n)
        terms.append((p, a, torch.randn(rows, n, generator=gen)))

    def f() -> Tensor:
        return sum(
            (0.5 * (p.float().reshape(b.shape) @ a - b).square().sum() for p, a, b in terms),
            torch.zeros(()),
        )

    with torch.no_grad():
        values = [float(f())]
    for i in range(QUADRATIC_STEPS):
        set_lr(opt, LR)
        opt.zero_grad(set_to_none=True)
        f().backward()
        step(target, opt, f"on the quadratic (step {i + 1})")
        with torch.no_grad():
            values.append(float(f()))
    if not (math.isfinite(values[-1]) and values[1] < values[0] and values[-1] < values[1]):
        trace = ", ".join(f"{v:.6g}" for v in values)
        fail(
            f"{who(target)}: steps at lr {LR:g} on the quadratic Σ ½‖W A − B‖² over the "
            f"parameters do not decrease it (after each step: {trace}); step against the "
            "gradient"
        )


@check("bfloat16", ("optimizer",), needs=model_buildable)
def bfloat16(target: Target, variant: str, settings: Settings) -> None:
    """Steps on a bfloat16 model leave every parameter bfloat16 and finite, and every floating
    tensor of its state finite."""
    model = probe(target, torch.bfloat16)
    opt, _, _ = make(target, model)
    for i, batch in enumerate(batches(BF16_STEPS)):
        train(target, model, opt, [batch], [LR], "on bfloat16 parameters ")
        for n, p in model.named_parameters():
            if p.dtype != torch.bfloat16:
                fail(
                    f"{who(target)}: after {i + 1} step(s) on a bfloat16 model, {n!r} is "
                    f"{str(p.dtype).removeprefix('torch.')}; update parameters in place, in "
                    "their own dtype"
                )
            if not bool(torch.isfinite(p).all()):
                fail(
                    f"{who(target)}: after {i + 1} step(s) on a bfloat16 model, {n!r} is not "
                    "finite; keep the update finite in bfloat16 (compute it in float32, or "
                    "guard divisions with eps)"
                )
        for index, state in opt.state_dict()["state"].items():
            for key, value in state.items():
                if (
                    isinstance(value, Tensor)
                    and value.is_floating_point()
                    and not bool(torch.isfinite(value).all())
                ):
                    fail(
                        f"{who(target)}: after {i + 1} step(s) on a bfloat16 model, its state "
                        f"{key!r} of parameter {index} is not finite"
                    )


# ------------------------------------------------------------------------------ schedule


def schedule(
    target: Target, steps: int, warmup: int, decay_steps: int, floor: float
) -> Callable[[int], Any]:
    from lmcore.train.recipe import build_schedule

    try:
        return build_schedule(part_of(target), lr=LR, min_lr=floor * LR, warmup=warmup,
                              decay_steps=decay_steps, steps=steps)  # fmt: skip
    except LmcoreError as e:
        fail(f"{who(target)}: at {at(steps, warmup, decay_steps, floor)}: {first_line(e)}")


def at(steps: int, warmup: int, decay_steps: int, floor: float) -> str:
    return f"steps={steps}, warmup={warmup}, decay_steps={decay_steps}, min_lr={floor * LR:g}"


def value(target: Target, fn: Callable[[int], Any], t: int, where: str) -> float:
    try:
        v = fn(t)
    except Exception as e:  # a plugin's fault, whatever it is
        fail(f"{who(target)}: at {where}, its value at step {t} raised {first_line(e)}")
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        fail(
            f"{who(target)}: at {where}, its value at step {t} is {v!r} "
            f"({type(v).__name__}), not a real number"
        )
    return float(v)


def check_values(target: Target, configs: Sequence[tuple[int, int, int, float]]) -> None:
    for steps, warmup, decay_steps, floor in configs:
        where = at(steps, warmup, decay_steps, floor)
        fn = schedule(target, steps, warmup, decay_steps, floor)
        for t in range(steps + 1 + BEYOND):
            v = value(target, fn, t, where)
            if not math.isfinite(v) or v < 0:
                fail(
                    f"{who(target)}: at {where}, its learning rate at step {t} is {v!r}; "
                    "a learning rate is finite and ≥ 0 at every step"
                )
            if v > LR * (1 + 1e-9):
                fail(
                    f"{who(target)}: at {where}, its learning rate at step {t} is {v:g}, above "
                    f"the peak lr={LR:g}; the runner's lr is the schedule's maximum"
                )


@check("values", ("schedule",))
def values(target: Target, variant: str, settings: Settings) -> None:
    """At every step 0 … steps (and a few beyond), for several steps, warmups and decay_steps,
    it gives a finite real number ≥ 0 and ≤ the peak lr."""
    check_values(target, SCHEDULES)


@check("edges", ("schedule",))
def edges(target: Target, variant: str, settings: Settings) -> None:
    """The same at the edges the runner allows: steps=1 (with and without a warmup step), no
    warmup, and a warmup as long as the run."""
    check_values(target, EDGES)


@check("warmup", ("schedule",))
def warmup(target: Target, variant: str, settings: Settings) -> None:
    """It honours the warmup: over steps 0 … warmup it never falls, stays below the peak lr
    until the warmup's last step, and is at the peak when the warmup ends."""
    for steps, warm, decay_steps, floor in (s for s in SCHEDULES if s[1] > 0):
        where = at(steps, warm, decay_steps, floor)
        fn = schedule(target, steps, warm, decay_steps, floor)
        vs = [value(target, fn, t, where) for t in range(warm + 1)]
        for t in range(warm):
            if vs[t + 1] < vs[t]:
                fail(
                    f"{who(target)}: at {where}, it falls during the warmup, from {vs[t]:g} at "
                    f"step {t} to {vs[t + 1]:g} at step {t + 1}; a warmup rises to the peak"
                )
            if vs[t] >= LR:
                fail(
                    f"{who(target)}: at {where}, it is at {vs[t]:g} at step {t}, inside the "
                    f"warmup, not below the peak lr={LR:g}; honour the warmup it is given"
                )
        if not math.isclose(vs[warm], LR, rel_tol=1e-6):
            fail(
                f"{who(target)}: at {where}, it is {vs[warm]:g} when the warmup ends (step "
                f"{warm}), not the peak lr={LR:g}"
            )


@check("pure", ("schedule",))
def pure(target: Target, variant: str, settings: Settings) -> None:
    """A function of the step alone, with no state: the same step gives the same value however
    often and in whatever order it is asked, from either of two schedules built alike (a resumed
    run starts mid-way)."""
    steps, warm, decay_steps, floor = SCHEDULES[0]
    where = at(steps, warm, decay_steps, floor)
    first = schedule(target, steps, warm, decay_steps, floor)
    second = schedule(target, steps, warm, decay_steps, floor)
    ts = list(range(steps + 1))
    shuffled = random.Random(settings.seed).sample(ts, len(ts))
    expected = {t: value(target, first, t, where) for t in ts}
    for how, fn, order in (
        ("asked again", first, ts),
        ("asked in reverse, from a second schedule built alike", second, ts[::-1]),
        ("asked in a shuffled order", first, shuffled),
    ):
        for t in order:
            v = value(target, fn, t, where)
            if v != expected[t] and not (math.isnan(v) and math.isnan(expected[t])):
                fail(
                    f"{who(target)}: at {where}, step {t} gave {expected[t]!r} and then, "
                    f"{how}, {v!r}; a schedule is a pure function of the step (no counters or "
                    "state), so that a resumed run gets the rates of one that never stopped"
                )
