"""A ladder's runs: one sweep per rung, then the points the fits take.

    plan = size_ladder(base, ["pos=nope"], rungs=4, factor=2, tokens_per_param=20, ...)
    result = run_ladder(plan, "data/stdlib-2k", "ladders/nope", TrainConfig(batch_size=16),
                        seeds=2)
    result.points                 # one `Point` per finished run: variant, seed, rung, N, D, C, loss

A ladder is a sweep over (variant, rung, seed), laid out as one `lmcore sweep` per rung
(`lmcore.train.sweep.sweep`, unchanged): `LADDER/rung<k>/` holds rung k's baseline and variants
under every seed, with the sweep's own run directories, `sweep.json`, `sweep.toml` and
comparison, and runs where the launcher puts them (this process, SLURM through submitit, Ray;
the runs of one rung together, the rungs one after another). Every run of rung k trains
`Rung.steps` steps of `batch_size × context` tokens. `LADDER/ladder.json` says what the
ladder is (its definition, which a re-run must repeat) and how it was sized (the plan, each
model's spec, N, FLOPs per token and run name).

Running the same ladder again continues it, as a sweep continues: finished runs are kept,
interrupted ones resume from their last checkpoint, missing ones are trained; another
ladder's definition in the directory is an error naming what differs.

A point's compute is the model's declared training FLOPs per token (`Size.flops_per_token`,
what `lmcore describe` checks against the FLOP counter) times the tokens its run trained on
(its run.json's); its loss is the run's last validation loss. Runs not done (diverged, failed,
interrupted) give no point and are listed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from lmcore.ladder.sizing import LadderError, LadderPlan
from lmcore.locks import LOCK_FILE, DirectoryLock, lock_file
from lmcore.train.runs import is_run, read_run, write_json

if TYPE_CHECKING:
    from lmcore.ladder.fits import Point
    from lmcore.registry import Registry
    from lmcore.train.launch import LauncherOptions
    from lmcore.train.sweep import Row

LADDER_FORMAT: Final = "lmcore-ladder"
LADDER_VERSION: Final = 1
LADDER_FILE: Final = "ladder.json"


def rung_dir(root: str | os.PathLike[str], index: int) -> Path:
    """Where rung `index`'s sweep lies."""
    return Path(root) / f"rung{index}"


@dataclass(frozen=True)
class LadderResult:
    """The ladder's description (as in ladder.json), its points, the runs without one, and
    whether a run was interrupted."""

    info: dict[str, Any]
    points: list[Point]
    missing: list[str] = field(default_factory=list)  # `rung k, LABEL, seed S: why`
    interrupted: str | None = None
    failed: list[Row] = field(default_factory=list)


def described(
    plan: LadderPlan, config: Any, seeds: int, data: str | os.PathLike[str]
) -> dict[str, Any]:
    """What makes a ladder this ladder: the same values on a re-run continue it."""
    cfg = {k: v for k, v in config.to_json().items() if k not in ("loggers", "log_group", "steps")}
    return {"format": LADDER_FORMAT, "version": LADDER_VERSION, "base": plan.base,
            "variants": list(plan.changes), "rungs": len(plan.rungs), "factor": plan.factor,
            "by": plan.by, "match": plan.match, "tokens_per_param": plan.tokens_per_param,
            "compute": plan.compute, "seeds": seeds, "config": cfg,
            "data": str(Path(data).resolve())}  # fmt: skip


def run_ladder(
    plan: LadderPlan,
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    config: Any = None,
    *,
    seeds: int = 1,
    launcher: LauncherOptions | None = None,
    echo: Any = print,
    progress: bool | None = None,
    registry: Registry | None = None,
) -> LadderResult:
    """Train every rung of `plan` (`lmcore.ladder.sizing.size_ladder`, with the same batch
    size and context as `config`) on `data` into `out`, `seeds` seeds per model; the points of
    the finished runs. See the module's docstring."""
    from lmcore.train.config import TrainConfig
    from lmcore.train.sweep import sweep

    say = echo or (lambda _line: None)
    cfg = config or TrainConfig()
    if cfg.batch_size != plan.batch_size or (cfg.context or plan.context) != plan.context:
        raise LadderError(
            f"the plan was sized for batch {plan.batch_size} × {plan.context} tokens, the config "
            f"trains {cfg.batch_size} × {cfg.context}; size the plan with the config's"
        )
    root = Path(out)
    info = {**described(plan, cfg, seeds, data), "plan": plan.to_json()}
    lock = _claim(root, info)
    failed: list[Row] = []
    try:
        for rung in plan.rungs:
            b = rung.baseline
            say(f"rung {rung.index}: {b.shape}, N {b.params:,}, {rung.steps:,} steps "
                f"({rung.tokens:,} tokens, {rung.compute:.3g} FLOPs)")  # fmt: skip
            rung_cfg = replace(cfg, steps=rung.steps, tokens=None)
            result = sweep(str(b.blueprint.spec), list(plan.changes), data,
                           rung_dir(root, rung.index), rung_cfg, seeds=seeds,
                           match=plan.by if plan.match else None, launcher=launcher, echo=echo,
                           progress=progress, registry=registry)  # fmt: skip
            failed += result.failed
            if result.interrupted is not None:
                points, missing = collect_points(root, info)
                return LadderResult(info, points, missing, result.interrupted, failed)
    finally:
        lock.release()
    points, missing = collect_points(root, info)
    return LadderResult(info, points, missing, None, failed)


def _claim(root: Path, info: dict[str, Any]) -> DirectoryLock:
    """Make `root` this ladder's directory, or check that it already is, holding its lock."""
    if root.exists() and not root.is_dir():
        raise LadderError(f"--out {root} is a file, not a directory; choose another --out")
    root.mkdir(parents=True, exist_ok=True)
    lock = lock_file(root / LOCK_FILE, what=f"ladder directory {root}", error=LadderError)
    try:
        file = root / LADDER_FILE
        if file.is_file():
            found = read_ladder(root, flag="--out")
            diff = [k for k in info if k != "plan" and found.get(k) != info[k]]
            if diff:
                raise LadderError(
                    f"--out {root} holds another ladder (its {', '.join(diff)} differ); re-run "
                    "that ladder's own command to continue it, or choose another --out"
                )
        elif any(p.name != LOCK_FILE for p in root.iterdir()):
            raise LadderError(
                f"--out {root} is not an empty directory and holds no ladder; choose a new or "
                "empty directory"
            )
        write_json(file, info)
    except BaseException:
        lock.release()
        raise
    return lock


def read_ladder(root: str | os.PathLike[str], flag: str = "--report") -> dict[str, Any]:
    """A ladder directory's `ladder.json`; `LadderError` naming what is wrong when `root` is
    not a ladder's directory."""
    import json

    path = Path(root)
    file = path / LADDER_FILE
    if not path.is_dir():
        raise LadderError(f"{flag} {root}: no such directory; give a ladder's --out")
    if not file.is_file():
        what = (
            " (it is a sweep's: lmcore compare reads it)" if (path / "sweep.json").is_file() else ""
        )
        raise LadderError(
            f"{flag} {root}: not a ladder's directory, no {LADDER_FILE} there{what}; give the "
            "--out of an lmcore ladder"
        )
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise LadderError(
            f"{file}: cannot be read as JSON ({e}); lmcore ladder writes it when the ladder "
            "starts: undo the edit, or run the ladder afresh with another --out"
        ) from None
    ok = (isinstance(found, dict) and found.get("format") == LADDER_FORMAT
          and isinstance(found.get("plan"), Mapping)
          and isinstance(found["plan"].get("rungs"), list))  # fmt: skip
    if not ok:
        raise LadderError(
            f"{file}: not a ladder's description (format {LADDER_FORMAT!r} with its plan); "
            "undo the edit, or run the ladder afresh with another --out"
        )
    if found.get("version") != LADDER_VERSION:
        raise LadderError(
            f"{file}: ladder format version {found.get('version')!r}, this lmcore reads "
            f"{LADDER_VERSION}; use the lmcore that wrote it"
        )
    return dict(found)


def collect_points(
    root: str | os.PathLike[str], info: Mapping[str, Any]
) -> tuple[list[Point], list[str]]:
    """The points of the ladder in `root` (described by `info`, its ladder.json), one per
    finished run; and a line for each run without one."""
    from lmcore.ladder.fits import Point

    points: list[Point] = []
    missing: list[str] = []
    seed0 = int(info["config"].get("seed") or 0)
    for rung in info["plan"]["rungs"]:
        k = int(rung["index"])
        for m in rung["models"]:
            for seed in range(seed0, seed0 + int(info["seeds"])):
                where = f"rung {k}, {m['label']}, seed {seed}"
                run = rung_dir(root, k) / f"{m['name']}-seed{seed}"
                if not is_run(run):
                    missing.append(f"{where}: not run")
                    continue
                status = read_run(run).get("status", {})
                state, loss = status.get("state"), status.get("val_loss")
                if state != "done" or not isinstance(loss, int | float):
                    # a run that raised still says `running`: its sweep's table knows better
                    state = _failures(rung_dir(root, k)).get(run.name, state)
                    missing.append(f"{where}: {state or 'no status'}")
                    continue
                tokens = int(status.get("tokens") or 0)
                points.append(Point(variant=m["label"], seed=seed, rung=k,
                                    params=int(m["params"]), tokens=tokens,
                                    flops=float(m["flops_per_token"]) * tokens,
                                    loss=float(loss)))  # fmt: skip
    return points, missing


def _failures(sweep_dir: Path) -> dict[str, str]:
    """The runs its comparison (`compare.json`) reports failed, by directory name, each as
    `failed: REASON`."""
    import json

    from lmcore.train.sweep import TABLE_JSON

    try:
        rows = json.loads((sweep_dir / TABLE_JSON).read_text(encoding="utf-8")).get("runs", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {Path(str(r.get("run"))).name: f"failed: {r.get('error')}" for r in rows
            if isinstance(r, dict) and r.get("state") == "failed"}  # fmt: skip


def write_points(points: Sequence[Point], path: Path) -> None:
    """The points as JSON (`points.json`), for a fit elsewhere."""
    from dataclasses import asdict

    write_json(path, {"points": [asdict(p) for p in points]})
