"""Ablation sweeps and comparisons: `lmcore sweep` and `lmcore compare`.

    result = sweep("cs336-tiny, vocab_size=2048", ["norm=none", "pos=nope"], "data/stdlib",
                   "sweeps/tiny", TrainConfig(steps=300), seeds=3, match="params")
    rows = compare_runs(["sweeps/tiny/baseline-1a2b3c4d-seed0", "runs/other"])

A sweep trains the baseline and each variant under each of `seeds` seeds (`config.seed`,
`config.seed + 1`, ...) into `SWEEP/<name>-<hash>-seed<S>` run directories, all with the same
options: the same budget and, for seed S, the same batches in the same order (a batch is a pure
function of the seed and the step), so the runs of one seed are paired. A variant is the base
spec with some `key=value` items replaced: `norm=none` on `tinystories` is `tinystories,
norm=none`; with `match`, its `d_ff` is then chosen to match the baseline's size
(`lmcore.train.matching`). The runs execute where the launcher puts them
(`lmcore.train.launch`: this process, SLURM through submitit, or Ray).

After each run the comparison is rewritten: `SWEEP/compare.md` (the table by variant, with the
paired intervals of `lmcore.train.summary`, then every run), `compare.json`, `val_loss.png`, and
`sweep.toml`, the sweep's definition (`lmcore.train.sweepfile`). A run that diverges is reported
as such and the sweep goes on; one that fails is reported with its reason and the sweep goes on.
Running the same sweep again continues it: finished runs are kept, interrupted ones resume from
their last checkpoint, missing ones are trained; nothing is trained twice.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lmcore.blueprint import Blueprint, resolve
from lmcore.errors import TrainError
from lmcore.locks import LOCK_FILE, DirectoryLock, lock_file
from lmcore.registry import Registry
from lmcore.spec import parse_items
from lmcore.train.matching import WHAT, measure
from lmcore.train.runs import RUN_FILE, is_run, read_metrics, read_run, slug, spec_hash, write_json
from lmcore.train.summary import recipe_note, summarize
from lmcore.train.sweepfile import MAX_SEEDS

if TYPE_CHECKING:
    from lmcore.train.launch import LauncherOptions, Outcome, RunTask
    from lmcore.train.matching import Match
    from lmcore.train.summary import Summary

SWEEP_FORMAT: Final = "lmcore-sweep"
SWEEP_VERSION: Final = 2
SWEEP_FILE: Final = "sweep.json"
TABLE_MD: Final = "compare.md"
TABLE_JSON: Final = "compare.json"
PLOT_FILE: Final = "val_loss.png"
DEFINITION_FILE: Final = "sweep.toml"
BASELINE: Final = "baseline"
# A run directory's name is its variant's slug, its hash and its seed: names longer than a
# file system takes (255 bytes) keep the slug's first characters (the hash tells runs apart).
SLUG_MAX: Final = 200


# ------------------------------------------------------------------------------ variants


@dataclass(frozen=True)
class Variant:
    """One run of a sweep: its label (`baseline` or the change), the change as written, the
    resolved model, the run directory's name, and the training options it changes (the
    recipe's: `lmcore.train.variants`) with the recipe it trains with."""

    label: str
    change: str
    blueprint: Blueprint
    name: str
    matched: Match | None = None  # what --match did to d_ff
    train: Mapping[str, Any] = field(default_factory=dict)  # TrainConfig fields it changes
    recipe: str = ""  # `optimizer · schedule`, canonical

    def run_name(self, seed: int) -> str:
        return f"{self.name}-seed{seed}"

    def config(self, base: Any) -> Any:
        """The `TrainConfig` of this variant's runs: `base` with its recipe options."""
        return replace(base, **self.train)


def variant_spec(base: str, change: str) -> str:
    """`base` with the model's items of `change` (`key=value, ...`) put in place of its own
    items of the same keys, or added (the recipe's keys, `lmcore.train.variants`, are left
    out): `variant_spec("tinystories, norm=layernorm", "norm=none")` is
    `"tinystories, norm=none"`."""
    from lmcore.train.variants import split_change

    spec = split_change(change).spec
    items = parse_items(spec) if spec else []
    keys = {item.key for item in items}
    kept = [base[i.start : i.value.end] for i in parse_items(base) if i.key not in keys]
    return ", ".join([*kept, *(spec[i.start : i.value.end] for i in items)])


def plan(
    base: str,
    changes: Sequence[str],
    registry: Registry | None = None,
    match: str | None = None,
    config: Any = None,
) -> list[Variant]:
    """The baseline and every variant, resolved (so a typo fails before any training): its
    model, and its runs' training config from `config` (`TrainConfig`) with the variant's
    recipe options, both optimizer and schedule resolved through the registry; with their
    run-directory names. With `match` (`params` or `flops`), each variant's `d_ff` matched to
    the baseline (`MatchError` when none can be). `TrainError` for a change that leaves the
    run as it was or repeats another variant."""
    from lmcore.train.config import TrainConfig
    from lmcore.train.matching import MATCH_BY, match_width, sets_d_ff
    from lmcore.train.variants import check_recipe, recipe_text, split_change

    if match is not None and match not in MATCH_BY:
        raise TrainError(f"--match {match!r}: must be one of {', '.join(MATCH_BY)}")
    cfg = config or TrainConfig()
    bp = resolve(base, registry)
    resolved, recipe = check_recipe(None, cfg, bp.spec.context_length, registry)
    runs = [Variant(BASELINE, "", bp, f"{BASELINE}-{spec_hash(bp.spec)}",
                    recipe=recipe_text(recipe))]  # fmt: skip
    seen = [_recipe_of(resolved, recipe)]
    for change in changes:
        label = ", ".join(t.strip() for t in change.split(","))
        split = split_change(change)
        bp = resolve(variant_spec(base, change), registry)
        matched = None
        if match is not None:
            if split.spec and sets_d_ff(split.spec):
                raise TrainError(
                    f"--vary {change!r} sets d_ff, the width --match {match} chooses; leave "
                    "d_ff out of the variant, or leave out --match"
                )
            matched = match_width(runs[0].blueprint, bp, match, label=f"--vary {change!r}",
                                  registry=registry)  # fmt: skip
            bp = matched.blueprint
        resolved, recipe = check_recipe(split, cfg, bp.spec.context_length, registry)
        own = _recipe_of(resolved, recipe)
        for other, theirs in zip(runs, seen, strict=True):
            if other.blueprint.spec == bp.spec and theirs == own:
                same = "the baseline" if other.label == BASELINE else f"--vary {other.label!r}"
                what = "model" if not split.train else "model with the same recipe"
                raise TrainError(
                    f"--vary {change!r} trains the same {what} as {same} ({bp.spec}"
                    f"{'; ' + recipe_text(recipe) if split.train else ''}); drop it or change "
                    "something else"
                )
        train = {k: own[k] for k in split.train}  # canonical: `schedule=wsd` as wsd(decay=0.2,…)
        ident = bp.spec if not train else f"{bp.spec}; {json.dumps(train, sort_keys=True)}"
        name = f"{slug(label)[:SLUG_MAX].rstrip('-')}-{spec_hash(ident)}"
        changed = {k: getattr(split.config(cfg), k) for k in split.train}
        runs.append(Variant(label, change, bp, name, matched, changed, recipe_text(recipe)))
        seen.append(own)
    return runs


def _recipe_of(resolved: Any, recipe: Any) -> dict[str, Any]:
    """What of a run's config and recipe tells two variants of one model apart."""
    from lmcore.train.variants import RECIPE_KEYS

    own = {k: getattr(resolved, k) for k in RECIPE_KEYS}
    return {**own, "optimizer": str(recipe.optimizer.spec), "schedule": str(recipe.schedule.spec)}


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
    seed: int | None = None
    val_bpb: float | None = None  # bits per byte of the last evaluation, when measured
    recipe: str | None = None  # `optimizer · schedule`, canonical (`lmcore.train.variants`)

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
        seed=info["config"].get("seed"),
        val_bpb=status.get("val_bpb", _last_bpb(path)),
        recipe=run_recipe(info),
    )


def run_recipe(info: Mapping[str, Any]) -> str | None:
    """A run's `optimizer · schedule` from its run.json: the canonical specs its `recipe`
    records (a run from before the recipe was recorded: its config's, when it has them)."""
    recipe, config = info.get("recipe") or {}, info.get("config") or {}
    parts = []
    for kind in ("optimizer", "schedule"):
        spec = (recipe.get(kind) or {}).get("spec") or config.get(kind)
        if not isinstance(spec, str):
            return None
        parts.append(spec)
    return " · ".join(parts)


def _last_bpb(path: str | os.PathLike[str]) -> float | None:
    """The `val_bpb` of a run's last evaluation record, when its evaluations measured one."""
    evals = [r for r in read_metrics(path) if r.get("kind") == "eval"]
    bpb = evals[-1].get("val_bpb") if evals else None
    return float(bpb) if isinstance(bpb, int | float) else None


RANK_KEYS: Final = ("val_loss", "val_bpb", "train_loss", "tokens_per_s")


def ranked(rows: Sequence[Row], by: str) -> list[Row]:
    """`rows` best first by `by` (one of `RANK_KEYS`: the losses ascending, tokens/s
    descending); runs without the value, or not done, last in their order."""
    if by not in RANK_KEYS:
        raise TrainError(f"--sort {by!r}: must be one of {', '.join(RANK_KEYS)}")
    sign = -1 if by == "tokens_per_s" else 1

    def key(r: Row) -> tuple[bool, float]:
        v = getattr(r, by)
        missing = v is None or r.state != "done" or (isinstance(v, float) and math.isnan(v))
        return missing, 0.0 if missing else sign * v

    return sorted(rows, key=key)


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


def table_markdown(rows: Sequence[Row], recipe_line: bool = True) -> str:
    """The comparison as a Markdown table. Runs of different recipes get a `recipe` column
    (`optimizer · schedule`); runs of one recipe, with `recipe_line`, a line naming it."""
    bpb = any(r.val_bpb is not None for r in rows)  # a column only when some run measured it
    recipes = list(dict.fromkeys(r.recipe for r in rows))
    column = len(recipes) > 1
    head = ("run", *(("recipe",) if column else ()), "parameters", "train loss", "val loss",
            *(("val bpb",) if bpb else ()), "Δ val", "tokens/s", "wall time",
            "status")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |",
             "| --- |" + " --- |" * column + " ---: |" * (6 + bpb) + " --- |"]  # fmt: skip
    for r in rows:
        delta = "" if r.delta_val is None else f"{r.delta_val:+.3f}"
        cells = (
            f"`{r.label}`",
            *((f"`{r.recipe}`" if r.recipe else "–",) if column else ()),
            _num(r.parameters, ","),
            _num(r.train_loss, ".3f"),
            _num(r.val_loss, ".3f"),
            *((_num(r.val_bpb, ".3f"),) if bpb else ()),
            delta or "–",
            _num(r.tokens_per_s, ",.0f"),
            "–" if r.wall_s is None else f"{r.wall_s:.0f} s",
            r.status,
        )
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if recipe_line and not column and recipes and recipes[0] is not None:
        text += f"\n{recipe_note(recipes[0], 'run')}\n"
    return text


def write_comparison(
    rows: Sequence[Row],
    out: str | os.PathLike[str],
    title: str,
    extra: dict[str, Any] | None = None,
    summaries: Sequence[Summary] | None = None,
    bands: Sequence[tuple[str, Sequence[Row]]] | None = None,
) -> tuple[Path, Path, Path]:
    """`compare.md`, `compare.json` and `val_loss.png` in `out`. With `summaries` (a sweep),
    the table by variant comes first; with `bands` (each variant's label and runs, over more
    than one seed), the plot draws each variant's mean curve in a band."""
    from lmcore.atomic import atomic_write
    from lmcore.train.plots import Band, Curve, plot_bands, plot_compare
    from lmcore.train.summary import summary_markdown

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    md, js, png = root / TABLE_MD, root / TABLE_JSON, root / PLOT_FILE
    with atomic_write(md, "w") as f:
        if summaries is None:
            f.write(f"{title}\n\n{table_markdown(rows)}")
        else:
            f.write(f"{title}\n\n{summary_markdown(summaries)}\nEvery run:\n\n"
                    f"{table_markdown(rows, recipe_line=False)}")  # fmt: skip
    variants = None if summaries is None else [s.to_json() for s in summaries]
    write_json(js, {"title": title, **(extra or {}),
                    **({} if variants is None else {"variants": variants}),
                    "runs": [asdict(r) for r in rows]})  # fmt: skip

    def records(r: Row) -> list[dict[str, Any]]:
        return read_metrics(r.run) if Path(r.run).is_dir() else []

    if bands is not None and max((len(runs) for _, runs in bands), default=0) > 1:
        plot_bands([Band(label, [records(r) for r in runs
                                 if r.state not in ("failed", "diverged")])
                    for label, runs in bands], png, title)  # fmt: skip
    else:
        plot_compare([Curve(r.label, records(r), r.diverged_at) for r in rows], png, title)
    return md, js, png


# ------------------------------------------------------------------------------ sweeping


@dataclass(frozen=True)
class SweepResult:
    """The rows of every run, the table by variant, whether the sweep was interrupted, and
    its files."""

    rows: list[Row]
    interrupted: str | None  # the signal (or reason) that stopped a run, if one did
    files: tuple[Path, Path, Path]
    summaries: list[Summary] = field(default_factory=list)

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
    seeds: int = 1,
    match: str | None = None,
    launcher: LauncherOptions | None = None,
    echo: Any = print,
    progress: bool | None = None,
    registry: Registry | None = None,
    source: str | None = None,
) -> SweepResult:
    """Train the baseline `base` and each variant of `changes` under `seeds` seeds with the
    same `config` (`TrainConfig`) on `data` into `out`, where `launcher` says (default: one
    after another in this process); with `match` (`params` or `flops`) each variant's `d_ff`
    matches the baseline's size. Writes the comparison and `out/sweep.toml` (`source`: the
    sweep file it came from, named in its first line).

    Running it again with the same arguments continues: finished runs are kept, interrupted
    ones resume, missing ones are trained. Another sweep in `out` is an error.
    """
    from lmcore.data.tokens import TokenData
    from lmcore.train.launch import LauncherOptions, RunTask, make_launcher
    from lmcore.train.sweepfile import SweepDefinition, write_definition
    from lmcore.train.trackers import check_trackers
    from lmcore.train.trainer import TrainConfig

    say = echo or (lambda _line: None)
    cfg = config or TrainConfig()
    if cfg.loggers and cfg.log_group is None:  # trackers group the variants under the sweep
        cfg = replace(cfg, log_group=Path(out).resolve().name)
    options = launcher or LauncherOptions()
    options.check()
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= MAX_SEEDS:
        raise TrainError(
            f"--seeds {seeds}: must be an integer from 1 to {MAX_SEEDS} (seeds per variant)"
        )
    check_trackers(cfg.loggers)  # an unreachable tracker fails here, not in every run
    variants = plan(base, changes, registry, match, cfg)  # every config and recipe checked
    tokens = TokenData.open(data)
    for v in variants:  # every model fits the data before the first step
        tokens.check(context_length=v.blueprint.spec.context_length,
                     vocab_size=v.blueprint.spec.vocab_size)  # fmt: skip
        if options.name != "local":
            v.config(cfg).cli_args()  # each run is an `lmcore train` command: every option one
    root = Path(out)
    runner = make_launcher(options, root, say, progress)
    runner.check()  # Ray's address answers, SLURM is here: before the directory is claimed
    described = {
        "format": SWEEP_FORMAT,
        "version": SWEEP_VERSION,
        "base": base,
        "variants": list(changes),
        "seeds": seeds,
        "match": match,
        # where the numbers are logged does not change them: trackers may change on a re-run
        "config": {k: v for k, v in cfg.to_json().items() if k not in ("loggers", "log_group")},
        "data": str(tokens.path.resolve()),
    }
    lock = _claim(root, described)
    try:
        definition = SweepDefinition(base=base, variants=tuple(changes), data=str(data),
                                     out=str(out), seeds=seeds, match=match,
                                     train=cfg.given(), launcher=options)  # fmt: skip
        write_definition(definition, root / DEFINITION_FILE, source)
        seed_list = [cfg.seed + k for k in range(seeds)]
        tasks: list[RunTask] = []
        for v in variants:
            for seed in seed_list:
                run = root / v.run_name(seed)
                action = "train"
                if is_run(run):
                    state = read_run(run).get("status", {}).get("state")
                    if state in ("done", "diverged"):
                        say(f"  {v.label}, seed {seed}: {state} before, kept ({run})")
                        continue
                    action = "resume"
                spec, run_cfg = str(v.blueprint.spec), replace(v.config(cfg), seed=seed)
                tasks.append(RunTask(v.label, seed, run, spec, run_cfg, action))
        matched = {v.label: v.matched.note for v in variants if v.matched is not None}
        if match is not None:
            matched[BASELINE] = f"d_ff {variants[0].blueprint.spec.d_ff} (the target)"
        title = f"{base} ({len(variants) - 1} variants, {seeds} seed{'s' * (seeds > 1)}"
        if match is not None:
            title += f", matched by {WHAT[match]}"
        title += ")"
        sizes = {v.label: int(measure(v.blueprint, "params")) for v in variants}
        recipes = {v.label: v.recipe for v in variants}
        outcomes: dict[Path, Outcome] = {}
        latest: list[Any] = []

        def table() -> None:
            rows, groups = [], []
            for v in variants:
                own = []
                for seed in seed_list:
                    run = root / v.run_name(seed)
                    outcome = outcomes.get(run)
                    label = v.label if seeds == 1 else f"{v.label}, seed {seed}"
                    if outcome is not None and outcome.error is not None:
                        own.append(_failed_row(v, run, outcome.error, seed, label))
                    elif is_run(run):
                        own.append(run_row(run, label))
                groups.append((v, own))
                rows += own
            rows = _paired_deltas(rows, groups[0][1])
            groups = [(v, [r for r in rows if r.run in {o.run for o in own}]) for v, own in groups]
            summaries = summarize(groups, seeds, matched, sizes, recipes)
            bands = [(v.label, own) for v, own in groups]
            files = write_comparison(rows, root, title, {"sweep": described}, summaries, bands)
            latest[:] = [rows, summaries, files]

        def finished(task: RunTask, outcome: Outcome) -> None:
            outcomes[task.run] = outcome
            if options.name != "local":
                if outcome.error is not None:
                    state = f"failed: {outcome.error}"
                elif outcome.interrupted is not None:
                    state = f"interrupted ({outcome.interrupted})"
                elif is_run(task.run):
                    state = read_run(task.run).get("status", {}).get("state", "?")
                else:
                    state = "ended without a run.json"
                say(f"  {task.label}, seed {task.seed}: {state}")
            table()

        table()
        stopped = runner.run(tasks, tokens.path, finished)
        table()
        rows, summaries, files = latest
        return SweepResult(rows, stopped, files, summaries)
    finally:
        lock.release()


def _paired_deltas(rows: Sequence[Row], baseline: Sequence[Row]) -> list[Row]:
    """Each finished run's validation loss minus that of the `baseline` run of its seed."""
    base = {r.seed: r.val_loss for r in baseline if r.state == "done"}
    out = []
    for r in rows:
        b, delta = base.get(r.seed), None
        if b is not None and r.val_loss is not None and r.state == "done":
            delta = r.val_loss - b
        out.append(Row(**{**asdict(r), "delta_val": delta}))
    return out


def _failed_row(
    v: Variant, run: Path, message: str, seed: int | None = None, label: str | None = None
) -> Row:
    if (run / RUN_FILE).is_file():
        row = run_row(run, label or v.label)
        return Row(**{**asdict(row), "state": "failed", "error": message})
    return Row(label or v.label, str(run), "", str(v.blueprint.spec), None, "failed", 0, 0, 0,
               None, None, None, None, None, None, error=message, seed=seed,
               recipe=v.recipe or None)  # fmt: skip


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


def read_sweep_json(file: Path) -> dict[str, Any]:
    """A sweep's `sweep.json`; `TrainError` naming the file and where it stops being JSON
    (an edit by hand), and what to do."""
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TrainError(
            f"{file}: not JSON at line {e.lineno}, column {e.colno} ({e.msg}); lmcore writes "
            "it when a sweep starts and it says which sweep the directory holds: undo the "
            "edit, or start the sweep afresh with another --out"
        ) from None
    except (UnicodeDecodeError, OSError) as e:
        raise TrainError(
            f"{file}: cannot read it ({e}); undo the edit, or start the sweep afresh with "
            "another --out"
        ) from None
    if not isinstance(found, dict):
        raise TrainError(
            f"{file}: not a sweep's description (a JSON object); undo the edit, or start the "
            "sweep afresh with another --out"
        )
    return found


def _check(root: Path, described: dict[str, Any]) -> None:
    file = root / SWEEP_FILE
    if file.is_file():
        found = read_sweep_json(file)
        if found != described:
            diff = [k for k in described if found.get(k) != described[k]]
            raise TrainError(
                f"--out {root} holds another sweep (its {', '.join(diff)} differ); re-run that "
                f"sweep's own command (or lmcore sweep --resume {root}) to continue it, or "
                "choose another --out"
            )
        return
    if any(p.name != LOCK_FILE for p in root.iterdir()):
        raise TrainError(
            f"--out {root} is not an empty directory and holds no sweep; choose a new or empty "
            "directory"
        )
    write_json(file, described)
