"""The recipe kinds' contracts (an optimizer's groups, lr, resume, quadratic and bfloat16; a
schedule's values, edges, warmup and purity) pass on a healthy third-party optimizer and
schedule, and each catches its planted bug with a message naming the component, its plugin and
what is wrong, while every other check passes. The built-ins' run is test_suite_builtins.py."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

from lmcore import Component, Registry
from lmcore.testing import ConformanceError, cases
from lmcore.testing.suite import SelectionError
from tests.helpers.errors import raises_naming
from tests.helpers.kit import NODE, WithBuiltins, failures, run_kit

pytest_plugins = ["pytester"]

# The plugin every planted component comes from, as the kit's messages name it.
FROM = "from registered in-process (plugin 'planted'"

# ------------------------------------------------------------------------------ optimizers


class Momentum(torch.optim.Optimizer):
    """A correct heavy-ball SGD with decoupled weight decay; the planted ones break it."""

    def __init__(self, groups: list[dict[str, Any]], lr: float, weight_decay: float):
        super().__init__(groups, {"lr": lr, "weight_decay": weight_decay})

    def groups_to_step(self) -> list[dict[str, Any]]:
        return self.param_groups

    def lr_of(self, group: dict[str, Any]) -> float:
        return float(group["lr"])

    def update(self, p: Tensor, buf: Tensor, lr: float) -> None:
        p.add_(buf, alpha=-lr)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.groups_to_step():
            lr = self.lr_of(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(p)
                buf = state["momentum"]
                buf.mul_(0.9).add_(p.grad)
                p.mul_(1 - lr * group["weight_decay"])
                self.update(p, buf, lr)


class SkipsAGroup(Momentum):
    def groups_to_step(self) -> list[dict[str, Any]]:
        return self.param_groups[:-1]  # the head's group is last


class DropsAGroup(Momentum):
    def __init__(self, groups: list[dict[str, Any]], lr: float, weight_decay: float):
        super().__init__(groups[:-1], lr, weight_decay)


def merges_roles(groups: list[dict[str, Any]], lr: float, weight_decay: float) -> Momentum:
    merged = {**groups[0], "params": [p for g in groups for p in g["params"]]}
    return Momentum([merged], lr, weight_decay)


def loses_keys(groups: list[dict[str, Any]], lr: float, weight_decay: float) -> Momentum:
    return Momentum([{"params": g["params"], "lr": g["lr"]} for g in groups], lr, weight_decay)


class KeepsItsLr(Momentum):
    def __init__(self, groups: list[dict[str, Any]], lr: float, weight_decay: float):
        super().__init__(groups, lr, weight_decay)
        self.fixed = lr

    def lr_of(self, group: dict[str, Any]) -> float:
        return self.fixed  # the rate at construction, not the one the runner sets


class FirstGroupsLr(Momentum):
    def lr_of(self, group: dict[str, Any]) -> float:
        return float(self.param_groups[0]["lr"])


class ForgetsMomentum(Momentum):
    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["state"] = {
            i: {k: v for k, v in s.items() if k != "momentum"} for i, s in sd["state"].items()
        }
        return sd


class Ascends(Momentum):
    def update(self, p: Tensor, buf: Tensor, lr: float) -> None:
        p.add_(buf, alpha=lr)


class NanOnBfloat16(Momentum):
    def update(self, p: Tensor, buf: Tensor, lr: float) -> None:
        # A bfloat16 path that divides by a difference that is zero.
        p.add_(buf / (buf - buf) if p.dtype == torch.bfloat16 else buf, alpha=-lr)


class SetInState(Momentum):
    def update(self, p: Tensor, buf: Tensor, lr: float) -> None:
        self.state[p]["seen"] = {"once"}  # not JSON: a checkpoint cannot hold it
        super().update(p, buf, lr)


def optimizer(name: str, cls: Any) -> Component:
    return Component(kind="optimizer", name=name, build=cls, help="planted")


HEALTHY_OPTIMIZER = optimizer("momentum", Momentum)

# (check, component, facts its message names)
PLANTED_OPTIMIZERS = [
    ("groups", optimizer("skips-a-group", SkipsAGroup),
     ("optimizer 'skips-a-group'", "1 parameter(s) did not change: 'lm_head.weight' (role(s) head)",
      "needs an update rule")),
    ("groups", optimizer("drops-a-group", DropsAGroup),
     ("optimizer 'drops-a-group'", "leaves 1 parameter(s) without an update rule, e.g. 'lm_head.weight'")),
    ("groups", optimizer("merges-roles", merges_roles),
     ("optimizer 'merges-roles'", "param_groups[0] says role='embedding' but holds parameters the runner gave with role",
      "'gain'", "never merge roles")),
    ("groups", optimizer("loses-keys", loses_keys),
     ("optimizer 'loses-keys'", "lacks ['lr_scale', 'role', 'fan_in', 'fan_out', 'splits']", "lr_scale before every step")),
    ("lr", optimizer("keeps-its-lr", KeepsItsLr),
     ("optimizer 'keeps-its-lr'", "set param_groups[0]['lr'] (role 'embedding') to 0, yet 'token_embeddings.weight' changed")),
    ("lr", optimizer("first-groups-lr", FirstGroupsLr),
     ("optimizer 'first-groups-lr'", "set param_groups[1]['lr'] (role 'gain') to 0.005, yet none of its parameters moved")),
    ("resume", optimizer("forgets-momentum", ForgetsMomentum),
     ("optimizer 'forgets-momentum'", "3 steps after resuming from its state_dict() are not those of the run that never stopped",
      "keep in state_dict() everything step() reads")),
    ("resume", optimizer("set-in-state", SetInState),
     ("optimizer 'set-in-state'", "its state_dict() cannot be written to a checkpoint", "set is not JSON serializable")),
    ("quadratic", optimizer("ascends", Ascends),
     ("optimizer 'ascends'", "on the quadratic Σ ½‖W A − B‖² over the parameters do not decrease it")),
    ("bfloat16", optimizer("nan-on-bfloat16", NanOnBfloat16),
     ("optimizer 'nan-on-bfloat16'", "after 1 step(s) on a bfloat16 model, 'token_embeddings.weight' is not finite")),
]  # fmt: skip

# ------------------------------------------------------------------------------ schedules


def warm_cosine(lr: float, min_lr: float, warmup: int, steps: int) -> Any:
    def at(t: int) -> float:
        if t < warmup:
            return t / warmup * lr
        p = min(1.0, (t - warmup) / max(1, steps - warmup))
        return min_lr + 0.5 * (1 + math.cos(math.pi * p)) * (lr - min_lr)

    return at


def impure(lr: float, warmup: int) -> Any:
    calls = iter(range(10**6))  # the step is the number of calls so far

    def at(t: int) -> float:
        n = next(calls)
        return n / warmup * lr if n < warmup else lr

    return at


def negative(lr: float, warmup: int, steps: int) -> Any:
    return lambda t: (
        t / warmup * lr if t < warmup else lr * math.cos(math.pi * (t - warmup) / (steps - warmup))
    )


def above_peak(lr: float, warmup: int) -> Any:
    return lambda t: t / warmup * lr if t < warmup else (lr if t == warmup else 2 * lr)


def no_warmup(lr: float) -> Any:
    return lambda t: lr


def divides_by_steps_less_one(lr: float, min_lr: float, warmup: int, steps: int) -> Any:
    def at(t: int) -> float:
        if t < warmup:
            return t / warmup * lr
        return lr - (lr - min_lr) * min(1.0, (t - warmup) / (steps - 1 - warmup))

    return at


def tensor_valued(lr: float, warmup: int) -> Any:
    return lambda t: torch.tensor(min(1.0, t / warmup) * lr if warmup else lr)


def schedule(name: str, build: Any) -> Component:
    return Component(kind="schedule", name=name, build=build, help="planted")


HEALTHY_SCHEDULE = schedule("warm-cosine", warm_cosine)

PLANTED_SCHEDULES = [
    ("pure", schedule("impure", impure),
     ("schedule 'impure'", "step 0 gave 0.0 and then, asked again, 0.01", "a pure function of the step")),
    ("values", schedule("negative", negative),
     ("schedule 'negative'", "at steps=100, warmup=10, decay_steps=100, min_lr=0.001, its learning rate at step 56 is -",
      "finite and ≥ 0")),
    ("values", schedule("above-peak", above_peak),
     ("schedule 'above-peak'", "its learning rate at step 11 is 0.02, above the peak lr=0.01")),
    ("warmup", schedule("no-warmup", no_warmup),
     ("schedule 'no-warmup'", "it is at 0.01 at step 0, inside the warmup, not below the peak lr=0.01")),
    ("edges", schedule("divides-by-steps-less-one", divides_by_steps_less_one),
     ("schedule 'divides-by-steps-less-one'", "at steps=1, warmup=0, decay_steps=1, min_lr=0.001, its value at step 0 raised",
      "division by zero")),
    ("values", schedule("tensor-valued", tensor_valued),
     ("schedule 'tensor-valued'", "(Tensor), not a real number")),
]  # fmt: skip

PLANTED = [*PLANTED_OPTIMIZERS, *PLANTED_SCHEDULES]
RECIPE_CHECKS = {"optimizer": ("groups", "lr", "resume", "quadratic", "bfloat16"),
                 "schedule": ("values", "edges", "warmup", "pure")}  # fmt: skip


def cases_of(component: Component) -> list[Any]:
    return cases(WithBuiltins(component).registry, components=[f"planted:{component.name}"])


@pytest.mark.parametrize("component", [HEALTHY_OPTIMIZER, HEALTHY_SCHEDULE], ids=lambda c: c.name)
def test_a_healthy_third_party_one_passes_every_check_of_its_kind(component: Component) -> None:
    found = cases_of(component)
    assert [c.check.name for c in found] == list(RECIPE_CHECKS[component.kind])
    for case in found:
        assert case.skip_reason is None
        case.run()


@pytest.mark.parametrize(("check", "component", "facts"), PLANTED,
                         ids=[f"{c}:{comp.name}" for c, comp, _ in PLANTED])  # fmt: skip
def test_each_planted_bug_fails_its_check_naming_it(
    check: str, component: Component, facts: tuple[str, ...]
) -> None:
    found = cases_of(component)
    [case] = [c for c in found if c.check.name == check]
    with raises_naming(ConformanceError, *facts, FROM):
        case.run()
    if component.name in ("drops-a-group", "loses-keys", "merges-roles"):
        return  # the runner's own refusal (or the lost keys) stops every check
    # A group never stepped moves at no lr; a bad value of a schedule is bad at the edges too,
    # and one that is no number fails every check that reads it.
    also = {"skips-a-group": {"lr"}, "tensor-valued": {"edges", "warmup", "pure"}}.get(
        component.name, {"edges"} if check == "values" else set()
    )
    for other in found:  # every other check passes
        if other.check.name not in {check, *also}:
            other.run()


def test_the_kinds_are_selectable_and_only_recipe_checks_apply() -> None:
    registry = WithBuiltins(HEALTHY_OPTIMIZER, HEALTHY_SCHEDULE).registry
    kinds = {c.target.label for c in cases(registry, kinds=["optimizer"])}
    assert kinds == {
        f"optimizer:{name}" for name in ("adamw", "torch_adamw", "sgd", "lion", "muon", "momentum")
    } | {"optimizer:sgd(nesterov=true)", "optimizer:muon(nesterov=false)"}  # booleans flipped
    names = {c.check.name for c in cases(registry, kinds=["optimizer", "schedule"])}
    assert names == {*RECIPE_CHECKS["optimizer"], *RECIPE_CHECKS["schedule"]}
    with raises_naming(SelectionError, "'optimiser' is not a component kind",
                       "(did you mean 'optimizer'?)", "optimizer, parametrization, pos, quant, schedule"):  # fmt: skip
        cases(registry, kinds=["optimiser"])


def test_without_the_default_model_components_the_optimizer_checks_skip_saying_why() -> None:
    alone = Registry(autoload=False)
    alone.add(HEALTHY_OPTIMIZER, HEALTHY_SCHEDULE, name="planted")
    found = cases(alone)
    reasons = {c.check.name: c.skip_reason for c in found}
    assert all(reasons[n] is None for n in RECIPE_CHECKS["schedule"])
    assert "the registry lacks the default block 'prenorm'" in str(reasons["resume"])


def test_the_pytest_plugin_runs_them_with_lmcore_kind_and_reports_the_contract(
    pytester: pytest.Pytester,
) -> None:
    plugin = WithBuiltins(HEALTHY_SCHEDULE, schedule("impure", impure))
    outcomes = run_kit(pytester, "--lmcore-kind", "schedule", "--lmcore-component", "planted:warm-cosine",
                       "--lmcore-component", "planted:impure", plugin=plugin)  # fmt: skip
    assert len(outcomes) == 8
    failed = failures(outcomes)
    assert list(failed) == [NODE + "test_pure[schedule:impure]"]
    report = failed[NODE + "test_pure[schedule:impure]"]
    assert "contract:  A function of the step alone, with no state" in report
    assert "component: schedule 'impure' from registered in-process (plugin 'planted'" in report
