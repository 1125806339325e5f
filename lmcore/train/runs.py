"""Run directories: what `lmcore train` writes into one (its layout, the file names and finding
a run's model and tokenizer are `lmcore.runfiles`'s).

A run is tagged by its canonical spec: `spec_tag(spec)` is a readable slug and a hash of
`str(spec)`, equal for equal models, so runs of the same model are recognisably one experiment.

One process at a time writes a run: `train` and `--resume` hold the OS lock on `RUN/.lock`
(`lmcore.locks`) for as long as they run, and a second one is refused naming the first; the
kernel releases the lock when the process ends, however it ends. A new run's directory is
created and checked under that lock (`claim_new_run`), so two starts into one `--out` cannot
both pass the check.

Nothing here is pickled: tensors are safetensors, the rest JSON. A checkpoint appears whole or
not at all: its files are written (and fsync'ed) into a hidden directory beside the others,
which is renamed into place, so a crash mid-save leaves the previous checkpoints as they were.

For later commands (`lmcore generate RUN`): `find_model(path)` takes a run directory, a
checkpoint directory or a model file and returns the model file
(`lmcore.runfiles.find_checkpoint`) and its tokenizer (`lmcore.runfiles.find_tokenizer`, the
one tokenizer search).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lmcore.atomic import atomic_write, fsync_directory
from lmcore.checkpoint import read_info
from lmcore.errors import LmcoreError, TrainError, TrainMemoryError, clip
from lmcore.jsonfile import dumps
from lmcore.locks import LOCK_FILE, DirectoryLock, lock_file
from lmcore.runfiles import (
    CHECKPOINT_FILES,
    CHECKPOINTS,
    META_STEP,
    META_TAG,
    META_TOKENIZER,
    META_TOKENS,
    METRICS_FILE,
    MODEL_FILE,
    PLOT_FILE,
    RUN_FILE,
    RUN_FORMAT,
    RUN_VERSION,
    STATE_JSON,
    STATE_TENSORS,
    TOKENIZER_FILE,
    find_checkpoint,
    find_tokenizer,
    is_run,
    read_run,
    step_dir,
    step_dirs,
)

__all__ = [
    "CHECKPOINTS",
    "CHECKPOINT_FILES",
    "META_STEP",
    "META_TAG",
    "META_TOKENIZER",
    "META_TOKENS",
    "METRICS_FILE",
    "MODEL_FILE",
    "PLOT_FILE",
    "RUN_FILE",
    "RUN_FORMAT",
    "RUN_VERSION",
    "STATE_JSON",
    "STATE_TENSORS",
    "TOKENIZER_FILE",
    "Checkpoint",
    "checkpoints",
    "find_model",
    "is_run",
    "latest_checkpoint",
    "read_metrics",
    "read_run",
    "spec_hash",
    "spec_tag",
    "step_dir",
]

# ------------------------------------------------------------------------------ tags


def spec_hash(spec: object) -> str:
    """The first 8 hex digits of SHA-256 of the canonical spec `str(spec)`."""
    return hashlib.sha256(str(spec).encode()).hexdigest()[:8]


def slug(text: str) -> str:
    """`text` with every run of characters other than letters, digits, `.`, `_` and `-`
    replaced by one `-` (no `=` or `/`, so the name is never taken for a spec or a path)."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-") or "run"


def spec_tag(spec: Any) -> str:
    """A readable name for a canonical `ModelSpec`, e.g. `L4-d128-rmsnorm-swiglu-rope-1a2b3c4d`:
    layers, width, the norm, FFN and positions (post-norm and a non-default kernel when used)
    and `spec_hash`. Equal models have equal tags; the hash tells apart what the slug leaves
    out."""
    parts = [f"L{spec.num_layers}", f"d{spec.d_model}", spec.norm.name, spec.ffn.name]
    parts.append(spec.pos.name)
    if spec.block.name != "prenorm":
        parts.append(spec.block.name)
    if spec.attn.name != "sdpa":
        parts.append(spec.attn.name)
    return f"{slug('-'.join(parts))}-{spec_hash(spec)}"


# ------------------------------------------------------------------------------ writing a run


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """`data` as indented JSON, written atomically."""
    with atomic_write(path, "w") as f:
        f.write(dumps(data) + "\n")


def lock_run(run: Path) -> DirectoryLock:
    """Hold `RUN/.lock` while this process writes the run: a second `train`, `--resume` or
    sweep of it meanwhile gets `TrainError` naming this process (PID, host, start time)."""
    return lock_file(run / LOCK_FILE, what=f"run directory {run}", error=TrainError)


def claim_new_run(run: Path) -> tuple[DirectoryLock, bool]:
    """Create the run directory `run` (or take an empty one) and lock it; `TrainError` when it
    holds a run or other files, or another process holds it. The check is made with the lock
    held, so two processes starting the same new run never both pass it. Returns the lock and
    whether this call created the directory."""
    if run.exists() and not run.is_dir():
        raise TrainError(f"--out {run} is a file, not a directory; choose another --out")
    try:
        run.mkdir(parents=True)
        created = True
    except FileExistsError:
        created = False
    lock = lock_run(run)
    try:
        if _is_stub(run):
            remove_stub(run, created=False)
        check_new_run(run)
    except BaseException:
        lock.release()
        raise
    return lock, created


def _is_stub(run: Path) -> bool:
    """Whether `run` holds only what a start that never took a step wrote (killed before it
    could remove it, e.g. a torchrun job aborted on another rank): run.json still "starting",
    no checkpoint, no metrics. Nothing in it is worth keeping; the caller holds the lock."""
    try:
        state = read_run(run).get("status", {}).get("state")
    except TrainError:
        return False
    return state == "starting" and not step_dirs(run) and not (run / METRICS_FILE).exists()


L = TypeVar("L")


def claim(par: Any, take: Callable[[], tuple[L, bool]], what: str) -> tuple[L | None, bool]:
    """`take()` on the writing process of `par` (a `Parallel`: it locks the run directory);
    every process raises when it fails there, so that none waits at a barrier for a writer that
    stopped. `(None, False)` on the others."""
    taken: tuple[L | None, bool] = (None, False)
    problem: LmcoreError | None = None
    if par.is_writer:
        try:
            taken = take()
        except LmcoreError as e:
            problem = e
    if par.any(problem is not None):
        raise problem or TrainError(f"{what}: the writing process (rank 0) could not take it")
    return taken


def memory_error(
    e: BaseException, batch_size: int, context_length: int, device: object
) -> TrainMemoryError | None:
    """The `TrainMemoryError` to raise for `e` when it says the run ran out of memory (numpy's
    and torch's errors, on the CPU and on CUDA), naming the batch and what to lower; else
    None."""
    text = str(e).strip()
    if not (
        isinstance(e, MemoryError)
        or type(e).__name__ == "OutOfMemoryError"  # torch.OutOfMemoryError (CUDA)
        or "can't allocate memory" in text  # torch's CPU allocator
        or "out of memory" in text.lower()
    ):
        return None
    what = clip(text.splitlines()[0] if text else type(e).__name__, 160, quote=False)
    return TrainMemoryError(
        f"out of memory with --batch-size {batch_size:,} × context_length {context_length:,} = "
        f"{batch_size * context_length:,} tokens a step on {device} ({what}); use a smaller "
        "--batch-size (a run that had not started is not kept)"
    )


def check_new_run(run: Path) -> None:
    """`TrainError` unless `run` is missing or an empty directory (its lock file aside)."""
    if (run / RUN_FILE).is_file():
        try:
            info = read_run(run)
            status = info.get("status", {})
            what = f"{info.get('tag')}, {status.get('state')} at step {status.get('step')}"
        except TrainError:
            what = "unreadable run.json"
        raise TrainError(
            f"--out {run} already holds a run ({what}); continue it with "
            f"`lmcore train --resume {run}`, or choose another --out"
        )
    if run.exists() and (not run.is_dir() or any(p.name != LOCK_FILE for p in run.iterdir())):
        raise TrainError(
            f"--out {run} is not an empty directory and holds no run; choose a new or empty "
            "directory for the run"
        )


def remove_stub(run: Path, created: bool) -> None:
    """Delete what a run that never took a step wrote (a start that failed): the whole
    directory when this process created it, else its contents, the lock file aside."""
    if created:
        shutil.rmtree(run, ignore_errors=True)
        return
    for p in run.iterdir():
        if p.name != LOCK_FILE:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


# ------------------------------------------------------------------------------ metrics


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of `RUN/metrics.jsonl` (or of the file itself), in order. A last line cut
    short by a crash is left out; an empty list when there is no file yet."""
    p = Path(path)
    file = p / METRICS_FILE if p.is_dir() else p
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


class MetricsWriter:
    """Appends records to `metrics.jsonl`, one JSON line each, flushed as written."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only the records of steps ≤ `step` (a resumed run repeats what came after its
    checkpoint), atomically."""
    kept = [r for r in read_metrics(path) if int(r.get("step", 0)) <= step]
    with atomic_write(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)


# ------------------------------------------------------------------------------ checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint directory of a run."""

    path: Path
    step: int

    @property
    def model(self) -> Path:
        """The model file: an ordinary lmcore checkpoint (`lmcore.load`, `lmcore describe`)."""
        return self.path / MODEL_FILE

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER_FILE


def checkpoints(run: str | os.PathLike[str]) -> list[Checkpoint]:
    """The complete checkpoints of a run (every file present), oldest first. Hidden
    directories of interrupted saves are not among them."""
    return [
        Checkpoint(d, step)
        for step, d in step_dirs(run)
        if all((d / f).is_file() for f in CHECKPOINT_FILES)
    ]


def latest_checkpoint(run: str | os.PathLike[str]) -> Checkpoint | None:
    """The run's checkpoint of the highest step, or None when it has none yet."""
    found = checkpoints(run)
    return found[-1] if found else None


@contextlib.contextmanager
def new_checkpoint_dir(run: Path, step: int) -> Iterator[Path]:
    """A hidden directory to write checkpoint `step` into; renamed to `step-NNNNNN` when the
    block ends without an exception (replacing an older checkpoint of the same step), removed
    when it raises. The files written inside should be fsync'ed (`lmcore.atomic` does)."""
    root = run / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir(step)
    tmp = root / f".{name}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir()
    try:
        yield tmp
        fsync_directory(tmp)
        dest = root / name
        old = None
        if dest.exists():  # rare: saving the same step twice; swap, then drop the old one
            old = root / f".{name}.{secrets.token_hex(4)}.old"
            os.replace(dest, old)
        os.replace(tmp, dest)
        fsync_directory(root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale(run: Path) -> None:
    """Delete the hidden directories that interrupted saves left behind."""
    root = run / CHECKPOINTS
    with contextlib.suppress(FileNotFoundError):
        for d in root.iterdir():
            if d.name.startswith(".step-") and d.is_dir():
                shutil.rmtree(d, ignore_errors=True)


def prune(run: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints (all of them when `keep` is 0)."""
    if keep <= 0:
        return
    for old in checkpoints(run)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)


# ------------------------------------------------------------------------------ finding models


def find_model(path: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    """`(model file, tokenizer.json or None)` for a run directory (its latest checkpoint), a
    checkpoint directory, or a model `.safetensors` file. `CheckpointError` when there is
    none."""
    model = find_checkpoint(path)
    return model, find_tokenizer(model, read_info(model).metadata).found
