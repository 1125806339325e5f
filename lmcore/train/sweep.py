"""Ablation sweeps and comparisons: `lmcore sweep` and `lmcore compare`.

    result = sweep("cs336-tiny, vocab_size=2048", ["norm=none", "pos=nope"], "data/stdlib",
                   "sweeps/tiny", TrainConfig(steps=300))
    rows = compare_runs(["sweeps/tiny/baseline-1a2b3c4d", "runs/other"])

A sweep trains the baseline and then each variant, one after another, into `SWEEP/<name>-<hash>`
run directories, all with the same options: the same budget, seed and so the same batches in
the same order (a batch is a pure function of the seed and the step). A variant is the base spec
with some `key=value` items replaced: `norm=none` on `tinystories` is `tinystories, norm=none`.
After each run the comparison is rewritten: `SWEEP/compare.md`, `compare.json` and
`val_loss.png`. A run that diverges is reported as such and the sweep goes on; one that fails
with an error is reported with it and the sweep goes on. Running the same command again
continues an interrupted sweep: finished runs are kept, an interrupted one resumes.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import LmcoreError, SpecError, TrainError, TrainMemoryError
from lmcore.locks import LOCK_FILE, DirectoryLock, lock_file
from lmcore.registry import Registry
from lmcore.spec import parse_items
from lmcore.train.runs import RUN_FILE, is_run, read_metrics, read_run, slug, spec_hash, write_json

SWEEP_FORMAT: Final = "lmcore-sweep"
SWEEP_FILE: Final = "sweep.json"
TABLE_MD: Final = "compare.md"
TABLE_JSON: Final = "compare.json"
PLOT_FILE: Final = "val_loss.png"
BASELINE: Final = "baseline"


# ------------------------------------------------------------------------------ variants


@dataclass(frozen=True)
class Variant:
    """One run of a sweep: its label (`baseline` or the change), the change as written, the
    resolved model and the run directory's name."""

    label: str
    change: str
    blueprint: Blueprint
    name: str


def variant_spec(base: str, change: str) -> str:
    """`base` with the items of `change` (`key=value, ...`) put in place of its own items of the
    same keys, or added: `variant_spec("tinystories, norm=layernorm", "norm=none")` is
    `"tinystories, norm=none"`."""
    try:
        items = parse_items(change)
    except SpecError as e:
        raise SpecError(f"--vary {change!r}: {e.message}", e.spec, e.start, e.end) from None
    for item in items:
        if item.key is None:
            raise SpecError(
                f"--vary {change!r}: {change[item.start : item.end]!r} is not a key=value item; "
                "a variant changes keys of the base spec, e.g. --vary norm=none (a preset "
                "belongs in the base spec)",
                change,
                item.start,
                item.end,
            )
    keys = {item.key for item in items}
    kept = [base[i.start : i.value.end] for i in parse_items(base) if i.key not in keys]
    return ", ".join([*kept, *(change[i.start : i.value.end] for i in items)])


def plan(base: str, changes: Sequence[str], registry: Registry | None = None) -> list[Variant]:
    """The baseline and every variant, resolved (so a typo fails before any training), with
    their run-directory names; `TrainError` for a change that leaves the model as it was or
    repeats another variant."""
    runs = [
        Variant(BASELINE, "", bp := resolve(base, registry), f"{BASELINE}-{spec_hash(bp.spec)}")
    ]
    for change in changes:
        label = ", ".join(t.strip() for t in change.split(","))
        bp = resolve(variant_spec(base, change), registry)
        for other in runs:
            if other.blueprint.spec == bp.spec:
                same = "the baseline" if other.label == BASELINE else f"--vary {other.label!r}"
                raise TrainError(
                    f"--vary {change!r} builds the same model as {same} ({bp.spec}); drop it or "
                    "change something else"
                )
        runs.append(Variant(label, change, bp, f"{slug(label)}-{spec_hash(bp.spec)}"))
    return runs


# ------------------------------------------------------------------------------ comparing


@dataclass(frozen=True)
class Row:
    """One run in a comparison."""

    label: str
    run: str
    tag: str
    spec: str
    parameters: int | None
    state: str  # done, diverged, interrupted, running, failed
    step: int
    steps: int
    tokens: int
    train_loss: float | None
    val_loss: float | None
    delta_val: float | None  # against the first row
    tokens_per_s: float | None
    train_s: float | None
    wall_s: float | None
    diverged_at: int | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        if self.state == "diverged":
            return f"diverged at step {self.diverged_at}"
        if self.state == "failed":
            return f"failed: {self.error}"
        if self.state == "done":
            return "done"
        return f"{self.state} at step {self.step}/{self.steps}"


def run_row(path: str | os.PathLike[str], label: str | None = None) -> Row:
    """A comparison row for the run in `path`, from its `run.json`."""
    info = read_run(path)
    status = info.get("status", {})
    train_s = status.get("train_s")
    tokens = int(status.get("tokens") or 0)
    return Row(
        label=label or Path(path).name,
        run=str(path),
        tag=info["tag"],
        spec=info["spec"],
        parameters=info.get("parameters"),
        state=status.get("state", "?"),
        step=int(status.get("step") or 0),
        steps=int(status.get("steps") or info["config"]["steps"]),
        tokens=tokens,
        train_loss=status.get("train_loss"),
        val_loss=status.get("val_loss"),
        delta_val=None,
        tokens_per_s=tokens / train_s if train_s else None,
        train_s=train_s,
        wall_s=status.get("elapsed_s"),
        diverged_at=status.get("diverged_at"),
    )


def with_deltas(rows: Sequence[Row]) -> list[Row]:
    """Each row's validation loss minus the first row's (where both are finite)."""
    base = rows[0].val_loss if rows else None
    out = []
    for r in rows:
        delta = None
        if base is not None and r.val_loss is not None and r.state == "done":
            delta = r.val_loss - base
        out.append(Row(**{**asdict(r), "delta_val": delta}))
    return out


def compare_runs(
    runs: Sequence[str | os.PathLike[str]], labels: Sequence[str] | None = None
) -> list[Row]:
    """Rows for existing run directories, deltas against the first."""
    names = list(labels) if labels is not None else [None] * len(runs)
    return with_deltas([run_row(r, n) for r, n in zip(runs, names, strict=True)])


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def table_markdown(rows: Sequence[Row]) -> str:
    """The comparison as a Markdown table."""
    head = ("run", "parameters", "train loss", "val loss", "Δ val", "tokens/s", "wall time",
            "status")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * 6 + " --- |"]
    for r in rows:
        delta = "" if r.delta_val is None else f"{r.delta_val:+.3f}"
        cells = (
            f"`{r.label}`",
            _num(r.parameters, ","),
            _num(r.train_loss, ".3f"),
            _num(r.val_loss, ".3f"),
            delta or "–",
            _num(r.tokens_per_s, ",.0f"),
            "–" if r.wall_s is None else f"{r.wall_s:.0f} s",
            r.status,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_comparison(
    rows: Sequence[Row],
    out: str | os.PathLike[str],
    title: str,
    extra: dict[str, Any] | None = None,
) -> tuple[Path, Path, Path]:
    """`compare.md`, `compare.json` and `val_loss.png` in `out`."""
    from lmcore.train.plots import Curve, plot_compare

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    md, js, png = root / TABLE_MD, root / TABLE_JSON, root / PLOT_FILE
    from lmcore.atomic import atomic_write

    with atomic_write(md, "w") as f:
        f.write(f"{title}\n\n{table_markdown(rows)}")
    write_json(js, {"title": title, **(extra or {}), "runs": [asdict(r) for r in rows]})
    curves = [
        Curve(r.label, read_metrics(r.run) if Path(r.run).is_dir() else [], r.diverged_at)
        for r in rows
    ]
    plot_compare(curves, png, title)
    return md, js, png


# ------------------------------------------------------------------------------ sweeping


@dataclass(frozen=True)
class SweepResult:
    """The rows of every run, whether the sweep was interrupted, and its files."""

    rows: list[Row]
    interrupted: str | None  # the signal (or reason) that stopped a run, if one did
    files: tuple[Path, Path, Path]

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.state == "failed"]


def sweep(
    base: str,
    changes: Sequence[str],
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    config: Any = None,
    *,
    echo: Any = print,
    progress: bool | None = None,
    registry: Registry | None = None,
) -> SweepResult:
    """Train the baseline `base` and each variant of `changes` with the same `config`
    (`TrainConfig`) on `data`, one after another, into `out`; write the comparison.

    Running it again with the same arguments continues: finished runs are kept, an
    interrupted one resumes, missing ones are trained. Another sweep in `out` is an error.
    """
    from lmcore.data.tokens import TokenData
    from lmcore.train.trainer import TrainConfig

    say = echo or (lambda _line: None)
    cfg = config or TrainConfig()
    variants = plan(base, changes, registry)
    tokens = TokenData.open(data)
    for v in variants:  # every model fits the data before the first step
        tokens.check(context_length=v.blueprint.spec.context_length,
                     vocab_size=v.blueprint.spec.vocab_size)  # fmt: skip
        cfg.resolved(v.blueprint.spec.context_length)
    root = Path(out)
    described = {
        "format": SWEEP_FORMAT,
        "version": 1,
        "base": base,
        "variants": list(changes),
        "config": cfg.to_json(),
        "data": str(tokens.path.resolve()),
    }
    lock = _claim(root, described)
    try:
        return _sweep(root, variants, described, tokens, cfg, say, echo, progress, base)
    finally:
        lock.release()


def _sweep(
    root: Path,
    variants: list[Variant],
    described: dict[str, Any],
    tokens: Any,
    cfg: Any,
    say: Any,
    echo: Any,
    progress: bool | None,
    base: str,
) -> SweepResult:
    from lmcore.train.trainer import TrainResult, resume, train

    rows: list[Row] = []
    interrupted: str | None = None
    title = f"{base} ({len(variants) - 1} variants)"
    files = (root / TABLE_MD, root / TABLE_JSON, root / PLOT_FILE)
    for n, v in enumerate(variants, 1):
        run = root / v.name
        say(f"[{n}/{len(variants)}] {v.label}: {v.blueprint.spec}")
        row: Row | None = None
        try:
            result: TrainResult | None = None
            if not is_run(run):
                result = train(v.blueprint, tokens, run, cfg, echo=echo, progress=progress)
            else:
                state = read_run(run).get("status", {}).get("state")
                if state in ("done", "diverged"):
                    say(f"  {run}: {state} before, kept")
                else:
                    result = resume(run, data=tokens, echo=echo, progress=progress)
            if result is not None and result.status == "interrupted":
                interrupted = result.reason or "interrupted"
        except TrainMemoryError as e:
            message = str(e)
            say(f"  {v.label} failed: {message}")
            row = _failed_row(v, run, message)
        except LmcoreError:
            raise
        except Exception as e:  # one variant failing (out of memory, a plugin's bug) ends only it
            message = f"{type(e).__name__}: {e}".splitlines()[0]
            say(f"  {v.label} failed: {message}")
            row = _failed_row(v, run, message)
        rows.append(row or run_row(run, v.label))
        rows = with_deltas(rows)
        files = write_comparison(rows, root, title, {"sweep": described})
        if interrupted:
            break
    return SweepResult(rows, interrupted, files)


def _failed_row(v: Variant, run: Path, message: str) -> Row:
    if (run / RUN_FILE).is_file():
        row = run_row(run, v.label)
        return Row(**{**asdict(row), "state": "failed", "error": message})
    return Row(v.label, str(run), "", str(v.blueprint.spec), None, "failed", 0, 0, 0, None,
               None, None, None, None, None, error=message)  # fmt: skip


def _claim(root: Path, described: dict[str, Any]) -> DirectoryLock:
    """Make `root` this sweep's directory, or check that it already is, holding its lock
    (`SWEEP/.lock`): a second sweep of it meanwhile is refused, naming this process."""
    if root.exists() and not root.is_dir():
        raise TrainError(f"--out {root} is a file, not a directory; choose another --out")
    root.mkdir(parents=True, exist_ok=True)
    lock = lock_file(root / LOCK_FILE, what=f"sweep directory {root}", error=TrainError)
    try:
        _check(root, described)
    except BaseException:
        lock.release()
        raise
    return lock


def _check(root: Path, described: dict[str, Any]) -> None:
    file = root / SWEEP_FILE
    if file.is_file():
        found = json.loads(file.read_text(encoding="utf-8"))
        if found != described:
            diff = [k for k in described if found.get(k) != described[k]]
            raise TrainError(
                f"--out {root} holds another sweep (its {', '.join(diff)} differ); re-run that "
                "sweep's own command to continue it, or choose another --out"
            )
        return
    if any(p.name != LOCK_FILE for p in root.iterdir()):
        raise TrainError(
            f"--out {root} is not an empty directory and holds no sweep; choose a new or empty "
            "directory"
        )
    write_json(file, described)
