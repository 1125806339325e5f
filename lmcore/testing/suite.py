"""Which checks run on which components: selection, argument variants and runnable cases.

    from lmcore.testing import cases
    for case in cases(get_registry(), components=["dyt"]):
        case.run()                       # raises ConformanceError naming the broken contract

Every component is checked with its default arguments; a boolean argument is also checked
flipped (``norm:dyt(bias=false)``), since it usually changes the parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

import lmcore.testing.checks  # noqa: F401  (registers every check)
from lmcore.components import ALL_KINDS
from lmcore.errors import LmcoreError, did_you_mean, one_of
from lmcore.registry import Entry, Registry, normalize_dist
from lmcore.testing.core import CHECKS, Check, Settings, Target, model_buildable


class SelectionError(LmcoreError, ValueError):
    """`--lmcore-kind` / `--lmcore-component` select nothing; the message lists what exists."""


class CaseSkipped(LmcoreError):
    """`Case.run` on a case that cannot run (`Case.skip_reason`, as pytest would skip it);
    `reason` says why."""

    def __init__(self, case: Case, reason: str):
        self.case, self.reason = case, reason
        super().__init__(f"{case.name} cannot run: {reason}")


@dataclass(frozen=True)
class Case:
    """One check on one component (in one variant, e.g. a dtype)."""

    check: Check
    target: Target
    variant: str = ""

    @property
    def param_id(self) -> str:
        """``norm:rmsnorm-float32``: the component and the variant."""
        return f"{self.target.label}-{self.variant}" if self.variant else self.target.label

    @property
    def name(self) -> str:
        """``test_forward[norm:rmsnorm-float32]``: the pytest item name."""
        return f"test_{self.check.name}[{self.param_id}]"

    @property
    def skip_reason(self) -> str | None:
        missing = self.target.missing
        if missing:
            return (
                f"{self.target.label} has required argument(s) {', '.join(missing)} with no "
                "default; the conformance kit builds components from their declared defaults"
            )
        needs = self.check.needs
        if needs is None and self.target.kind == "block":  # built with the default parts
            needs = model_buildable
        if needs is not None:
            reason = needs(self.target)
            if reason:
                return reason
        declaration = self.check.declaration
        if declaration and getattr(self.target.component, declaration) is None:
            return (
                f"{self.target.label} declares no {declaration}= (optional; without it "
                f"`lmcore describe` measures them on the meta device, about a second slower)"
            )
        return None

    def run(self, settings: Settings | None = None) -> None:
        """Run the check; raise ConformanceError when the component breaks the contract, and
        `CaseSkipped` (with the reason) for a case that cannot run, one pytest would skip.

        The global RNG is seeded for the run and restored afterwards.
        """
        reason = self.skip_reason
        if reason:
            raise CaseSkipped(self, reason)
        settings = settings or Settings()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            self.check.fn(self.target, self.variant, settings)


def select(
    registry: Registry, kinds: Sequence[str] = (), components: Sequence[str] = ()
) -> list[Entry]:
    """The registered components of `kinds` (all when empty) named by `components` (all when
    empty); each selector is ``name`` or ``dist:name``. Raise SelectionError on a miss."""
    for kind in kinds:
        if kind not in ALL_KINDS:
            raise SelectionError(
                f"--lmcore-kind {kind!r} is not a component kind{did_you_mean(kind, ALL_KINDS)}; "
                f"kinds are {one_of(ALL_KINDS)}"
            )
    pool = [e for e in registry.entries() if not kinds or e.kind in kinds]
    if not components:
        return pool
    chosen: list[Entry] = []
    for selector in components:
        provider, _, name = selector.rpartition(":")
        found = [
            e
            for e in pool
            if e.name == name
            and (not provider or normalize_dist(e.provenance.qualifier) == normalize_dist(provider))
        ]
        if not found:
            raise SelectionError(_no_match(registry, selector, name, kinds, pool))
        chosen += [e for e in found if e not in chosen]
    return chosen


def _no_match(
    registry: Registry, selector: str, name: str, kinds: Sequence[str], pool: list[Entry]
) -> str:
    where = f" of kind {', '.join(kinds)}" if kinds else ""
    names = {e.name for e in pool}
    qualified = {f"{e.provenance.qualifier}:{e.name}" for e in pool}
    choices = qualified if ":" in selector else names
    message = (
        f"--lmcore-component {selector!r} matches no registered component{where}"
        f"{did_you_mean(selector, choices) or did_you_mean(name, names)}; registered: "
        f"{one_of(qualified)} (`lmcore plugins` lists them with their distributions)"
    )
    failed = [r for r in registry.plugins() if r.status == "failed"]
    if failed:
        message += "; plugins that failed to load: " + "; ".join(
            f"{r.name!r} ({r.provenance}): {r.reason}" for r in failed
        )
    return message


def targets(entries: Iterable[Entry], registry: Registry | None = None) -> list[Target]:
    """Each entry with its default arguments, plus one variant per flipped boolean argument
    (with the arguments it takes effect with, `Arg.applies_with`)."""
    out: list[Target] = []
    for e in entries:
        # A name two plugins provide is labelled with its provider, as a spec must write it.
        qualified = e.status == "shadowed"
        out.append(Target(e, qualified=qualified, registry=registry))
        for arg in e.component.args:
            if arg.type is bool and not arg.required:
                flipped = ((arg.name, not arg.default), *arg.applies_with)
                out.append(Target(e, flipped, qualified=qualified, registry=registry))
    return out


def cases(
    registry: Registry, kinds: Sequence[str] = (), components: Sequence[str] = ()
) -> list[Case]:
    """Every applicable check on every selected component, in a stable order."""
    found: list[Case] = []
    for target in targets(select(registry, kinds, components), registry):
        for check in CHECKS:
            if check.applies_to(target):
                found += [Case(check, target, variant) for variant in check.variants]
    return found
