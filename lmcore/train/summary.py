"""A sweep's result by variant: the mean over seeds and the paired interval of the difference.

    summaries = summarize(variants, rows)      # rows: every run's `Row`, with its seed
    print(summary_markdown(summaries))

For each variant, the runs of the seeds that finished (`done`, a finite validation loss) give
the mean final validation loss (and bits per byte, when the runs measured it); the seeds where
both the variant and the baseline finished give the paired differences, whose mean and 95 %
paired t-interval (`lmcore.train.stats.paired_interval`) the table shows. A difference whose
interval leaves zero out is marked `*`: distinguishable from zero at that level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmcore.train.stats import Interval, mean, paired_interval

MARK = "*"


@dataclass(frozen=True)
class Summary:
    """One variant over its seeds."""

    label: str
    spec: str
    non_embedding: int | None  # from the declarations
    matched: str | None  # what --match did, e.g. "d_ff 512→480 (+0.00%)"
    seeds: int  # planned
    done: int  # finished with a finite validation loss
    val_loss: float | None  # mean over the finished seeds
    delta: Interval | None  # paired against the baseline
    val_bpb: float | None = None
    delta_bpb: Interval | None = None
    problems: tuple[str, ...] = ()  # "seed 1: diverged at step 5", ...
    recipe: str | None = None  # `optimizer · schedule`, canonical (`lmcore.train.variants`)

    @property
    def status(self) -> str:
        head = f"{self.done}/{self.seeds} done"
        return "; ".join([head, *self.problems])

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "spec": self.spec, "non_embedding": self.non_embedding,
                "matched": self.matched, "seeds": self.seeds, "done": self.done,
                "val_loss": self.val_loss,
                "delta_val": None if self.delta is None else self.delta.to_json(),
                "val_bpb": self.val_bpb,
                "delta_bpb": None if self.delta_bpb is None else self.delta_bpb.to_json(),
                "recipe": self.recipe, "status": self.status}  # fmt: skip


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _finished(rows: Sequence[Any], key: str) -> dict[int, float]:
    return {r.seed: getattr(r, key) for r in rows if r.state == "done" and _finite(getattr(r, key))}


def _paired(variant: Mapping[int, float], baseline: Mapping[int, float]) -> Interval | None:
    both = sorted(set(variant) & set(baseline))
    if not both:
        return None
    return paired_interval([variant[s] for s in both], [baseline[s] for s in both])


def summarize(
    groups: Sequence[tuple[Any, Sequence[Any]]],
    seeds: int,
    matched: Mapping[str, str] | None = None,
    non_embedding: Mapping[str, int] | None = None,
    recipes: Mapping[str, str] | None = None,
) -> list[Summary]:
    """One `Summary` per `(variant, its rows)` of `groups`, the baseline first; a row needs
    `seed`, `state`, `val_loss`, `val_bpb` and `status` (`lmcore.train.sweep.Row`). `matched`,
    `non_embedding` and `recipes` (`optimizer · schedule`) are by the variant's label."""
    out = []
    base_loss: dict[int, float] = {}
    base_bpb: dict[int, float] = {}
    for n, (variant, rows) in enumerate(groups):
        loss, bpb = _finished(rows, "val_loss"), _finished(rows, "val_bpb")
        if n == 0:
            base_loss, base_bpb = loss, bpb
        problems = tuple(f"seed {r.seed}: {r.status}" for r in rows if r.state != "done")
        out.append(
            Summary(
                label=variant.label,
                spec=str(variant.blueprint.spec),
                non_embedding=(non_embedding or {}).get(variant.label),
                matched=(matched or {}).get(variant.label),
                seeds=seeds,
                done=len(loss),
                val_loss=mean(list(loss.values())) if loss else None,
                delta=None if n == 0 else _paired(loss, base_loss),
                val_bpb=mean(list(bpb.values())) if bpb else None,
                delta_bpb=None if n == 0 else _paired(bpb, base_bpb),
                problems=problems,
                recipe=(recipes or {}).get(variant.label),
            )
        )
    return out


def _delta(iv: Interval | None, digits: int = 3) -> str:
    if iv is None:
        return "–"
    text = f"{iv.mean:+.{digits}f}"
    if iv.low is not None and iv.high is not None:
        text += f" [{iv.low:+.{digits}f}, {iv.high:+.{digits}f}]"
        if iv.distinguishable:
            text += f" {MARK}"
    return text


def summary_markdown(summaries: Sequence[Summary]) -> str:
    """The summaries as a Markdown table, with a line saying what the interval is."""
    bpb = any(s.val_bpb is not None for s in summaries)
    matched = any(s.matched for s in summaries)
    recipes = list(dict.fromkeys(s.recipe for s in summaries))
    column = len(recipes) > 1  # variants of different recipes; one recipe: a line under it
    head = ["variant", *(["recipe"] if column else []), *(["matched"] if matched else []),
            "non-embedding params", "val loss", "Δ val [95% CI]",
            *(["val bpb", "Δ bpb [95% CI]"] if bpb else []), "status"]  # fmt: skip
    align = [" --- ", *([" --- "] if column else []), *([" --- "] if matched else []),
             " ---: ", " ---: ", " ---: ", *([" ---: ", " ---: "] if bpb else []),
             " --- "]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for s in summaries:
        cells = [f"`{s.label}`", *([f"`{s.recipe}`" if s.recipe else "–"] if column else []),
                 *([s.matched or "–"] if matched else []),
                 "–" if s.non_embedding is None else f"{s.non_embedding:,}",
                 "–" if s.val_loss is None else f"{s.val_loss:.3f}", _delta(s.delta)]  # fmt: skip
        if bpb:
            cells += ["–" if s.val_bpb is None else f"{s.val_bpb:.4f}", _delta(s.delta_bpb, 4)]
        cells.append(s.status)
        lines.append("| " + " | ".join(cells) + " |")
    pairs = max((s.delta.n for s in summaries if s.delta is not None), default=0)
    note = (
        "Δ: the variant minus the baseline, averaged over the seeds both finished (the same "
        "batches in the same order), with its 95% paired t-interval"
    )
    note += (
        f"; {MARK}: the interval leaves out 0 (distinguishable from zero)."
        if pairs > 1
        else ("; one seed gives no interval (--seeds N).")
    )
    shared = ""
    if not column and recipes and recipes[0] is not None:
        shared = f"\n\n{recipe_note(recipes[0], 'variant')}"
    return "\n".join(lines) + f"{shared}\n\n{note}\n"


def recipe_note(recipe: str, what: str) -> str:
    """The line under a table whose rows (each a `what`) share one recipe, `optimizer ·
    schedule`: `Every run: optimizer `adamw`, schedule `cosine`.`"""
    optimizer, _, schedule = recipe.partition(" · ")
    return f"Every {what}: optimizer `{optimizer}`, schedule `{schedule}`."


SORT_KEYS = ("val_loss", "val_bpb")


def ranked_summaries(summaries: Sequence[Summary], by: str) -> list[Summary]:
    """The variants best first by their mean `by` (`val_loss` or `val_bpb`, ascending);
    variants without it last, in their order. `TrainError` for another key."""
    from lmcore.errors import TrainError

    if by not in SORT_KEYS:
        raise TrainError(
            f"--sort {by!r}: a sweep's table ranks its variants by {' or '.join(SORT_KEYS)} "
            "(lmcore compare ranks single runs by train_loss and tokens_per_s too)"
        )

    def key(s: Summary) -> tuple[bool, float]:
        v = getattr(s, by)
        return (not _finite(v), v if _finite(v) else 0.0)

    return sorted(summaries, key=key)
