"""Matched budgets: a variant's `d_ff` chosen so that its size matches the baseline's.

    m = match_width(baseline_bp, variant_bp, "params")   # d_ff 512 -> 480, +0.00 %
    m.blueprint                                     # the variant with that d_ff

A variant that changes the feed-forward network or the attention usually changes the model's
size, so a worse loss may only mean a smaller model. `match_width` adjusts the one width every
built-in FFN has, `d_ff`, so that the variant's measure is within `TOLERANCE` (1 %) of the
baseline's, from the components' own declarations (`lmcore.model.counting.account`, the
numbers `lmcore describe` prints), before any weight exists:

- `params`: non-embedding parameters, every row of the accounting but the token embeddings,
  the positional encoding's own parameters and `lm_head` (Kaplan et al.'s N);
- `flops`: training FLOPs per token, three times the forward FLOPs of one full-context
  sequence divided by its length (the backward pass costs about twice the forward), attention
  and `lm_head` included.

A variant already within 1 % keeps its `d_ff`; otherwise the `d_ff` whose measure is closest to
the baseline's is taken (a bisection: every built-in FFN grows with `d_ff`). When no `d_ff` in
1 .. 2**24 comes within 1 % (the rest of the model is already larger than the baseline, or the
variant's FFN does not use `d_ff`), `MatchError` says so and what the closest was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import TrainError
from lmcore.registry import Registry
from lmcore.spec import parse_items

MATCH_BY: Final = ("params", "flops")
TOLERANCE: Final = 0.01
MAX_D_FF: Final = 2**24
NON_EMBEDDING: Final = frozenset({"embeddings", "lm_head"})  # parts left out of `params`
WHAT: Final = {"params": "non-embedding parameters", "flops": "training FLOPs per token"}


class MatchError(TrainError):
    """No `d_ff` makes a variant match the baseline within the tolerance."""


@dataclass(frozen=True)
class Match:
    """What matching did to one variant: its `d_ff` before and after, and the measures."""

    by: str
    d_ff_before: int
    d_ff: int
    target: float  # the baseline's measure
    value: float  # the variant's, at `d_ff`
    blueprint: Blueprint

    @property
    def changed(self) -> bool:
        return self.d_ff != self.d_ff_before

    @property
    def relative(self) -> float:
        """The variant's measure relative to the baseline's, minus one."""
        return self.value / self.target - 1 if self.target else 0.0

    @property
    def note(self) -> str:
        """`d_ff 512→480 (+0.00%)`, or `d_ff 320 (as is, -0.09%)` when left alone."""
        if self.changed:
            return f"d_ff {self.d_ff_before}→{self.d_ff} ({self.relative:+.2%})"
        return f"d_ff {self.d_ff} (as is, {self.relative:+.2%})"

    def to_json(self) -> dict[str, object]:
        return {"by": self.by, "d_ff_before": self.d_ff_before, "d_ff": self.d_ff,
                "baseline": self.target, "value": self.value,
                "relative": self.relative}  # fmt: skip


def measure(bp: Blueprint, by: str) -> float:
    """`bp`'s non-embedding parameters (`params`) or training FLOPs per token (`flops`)."""
    from lmcore.model.counting import account

    acc = account(bp)
    if by == "params":
        return float(sum(r.params for r in acc.rows if r.part not in NON_EMBEDDING))
    if by == "flops":
        return 3 * acc.flops / acc.seq_len
    raise TrainError(f"--match {by!r}: must be one of {', '.join(MATCH_BY)}")


def sets_d_ff(change: str) -> bool:
    """Whether a `--vary` change sets `d_ff` itself (as a key or an argument of `ffn`)."""
    for item in parse_items(change):
        if item.key == "d_ff":
            return True
        if item.key == "ffn" and any(a[0] == "d_ff" for a in (item.value.args or ())):
            return True
    return False


def with_d_ff(bp: Blueprint, d_ff: int, registry: Registry | None = None) -> Blueprint:
    """`bp` with its feed-forward width set to `d_ff` (from its canonical spec)."""
    canonical = str(bp.spec)  # every key written out, d_ff among them
    items = [canonical[i.start : i.value.end] for i in parse_items(canonical) if i.key != "d_ff"]
    return resolve(", ".join([*items, f"d_ff={d_ff}"]), registry)


def match_width(
    baseline: Blueprint,
    variant: Blueprint,
    by: str,
    *,
    label: str = "the variant",
    registry: Registry | None = None,
) -> Match:
    """`variant` with the `d_ff` that matches `baseline` by `by` within `TOLERANCE`; see the
    module's docstring. `MatchError` when none does."""
    target = measure(baseline, by)
    before = variant.spec.d_ff
    value = measure(variant, by)
    if abs(value - target) <= TOLERANCE * target:
        return Match(by, before, before, target, value, variant)
    cache: dict[int, tuple[float, Blueprint]] = {before: (value, variant)}

    def at(d_ff: int) -> float:
        if d_ff not in cache:
            bp = with_d_ff(variant, d_ff, registry)
            cache[d_ff] = (measure(bp, by), bp)
        return cache[d_ff][0]

    lo, hi = 1, max(before, 1)
    while at(hi) < target and hi < MAX_D_FF:
        lo, hi = hi, min(2 * hi, MAX_D_FF)
    while hi - lo > 1:  # the smallest d_ff reaching the target lies in (lo, hi]
        mid = (lo + hi) // 2
        if at(mid) >= target:
            hi = mid
        else:
            lo = mid
    best = min((lo, hi), key=lambda d: (abs(at(d) - target), d))
    if at(1) >= target:
        best = 1
    found, bp = cache[best]
    if abs(found - target) > TOLERANCE * target:
        what = WHAT[by]
        if at(1) == at(MAX_D_FF):
            why = f"its ffn {variant.spec.ffn.name!r} does not grow with d_ff"
        elif at(1) > target:
            why = "even at d_ff=1 the rest of the model is larger"
        else:
            why = "the closest d_ff is too coarse a step"
        raise MatchError(
            f"--match {by}: no d_ff makes {label} match the baseline's {target:,.0f} {what} "
            f"within {TOLERANCE:.0%}: {why} (d_ff={best:,} gives {found:,.0f}, "
            f"{found / target - 1:+.1%}); change the variant (e.g. fewer layers) or leave out "
            "--match"
        )
    return Match(by, before, best, target, found, bp)
