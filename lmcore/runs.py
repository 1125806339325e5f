"""Run directories: what `lmcore train` writes, and how to find a run's checkpoints and tokenizer.

    RUN/
      run.json              the experiment: tag, canonical spec, data, resolved options, status
      tokenizer.json        a copy of the data's tokenizer
      metrics.jsonl         one JSON object per line: train, eval and event records
      loss.png              train and validation loss against tokens
      checkpoints/
        step-000200/        one complete checkpoint (written as a hidden directory, renamed)
          model.safetensors     lmcore.save: weights, spec, provenance (+ train.* metadata)
          trainer.safetensors   AdamW's moments and step counts, torch/CUDA/numpy RNG states
          trainer.json          step, tokens, times, data position, AdamW's groups, Python RNG
          tokenizer.json        so that the checkpoint directory stands alone

A run is tagged by its canonical spec: `spec_tag(spec)` is a readable slug and a hash of
`str(spec)`, equal for equal models, so runs of the same model are recognisably one experiment.

Nothing here is pickled: tensors are safetensors, the rest JSON. A checkpoint appears whole or
not at all: its files are written (and fsync'ed) into a hidden directory beside the others,
which is renamed into place, so a crash mid-save leaves the previous checkpoints as they were.

For later commands (`lmcore generate RUN`): `find_model(path)` takes a run directory, a
checkpoint directory or a model file and returns the model file and its tokenizer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from lmcore.atomic import atomic_write, fsync_directory
from lmcore.errors import TrainError
from lmcore.jsonfile import read_versioned

__all__ = [
    "CHECKPOINTS",
    "METRICS_FILE",
    "MODEL_FILE",
    "PLOT_FILE",
    "RUN_FILE",
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
    "tokenizer_of",
]

RUN_FORMAT: Final = "lmcore-run"
RUN_VERSION: Final = 1
RUN_FILE: Final = "run.json"
METRICS_FILE: Final = "metrics.jsonl"
PLOT_FILE: Final = "loss.png"
TOKENIZER_FILE: Final = "tokenizer.json"
CHECKPOINTS: Final = "checkpoints"
MODEL_FILE: Final = "model.safetensors"
STATE_TENSORS: Final = "trainer.safetensors"
STATE_JSON: Final = "trainer.json"
CHECKPOINT_FILES: Final = (MODEL_FILE, STATE_TENSORS, STATE_JSON, TOKENIZER_FILE)
# The model file's metadata keys that point back to its run (strings, safetensors metadata).
META_STEP: Final = "train.step"
META_TOKENS: Final = "train.tokens"
META_TAG: Final = "train.tag"
META_TOKENIZER: Final = "train.tokenizer"  # a path relative to the model file's directory
_STEP_DIR = re.compile(r"step-(\d+)")


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
    if spec.block != "prenorm":
        parts.append(spec.block)
    if spec.attn.name != "sdpa":
        parts.append(spec.attn.name)
    return f"{slug('-'.join(parts))}-{spec_hash(spec)}"


# ------------------------------------------------------------------------------ run.json


def is_run(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a directory holding a `run.json`."""
    return (Path(path) / RUN_FILE).is_file()


def read_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The contents of `RUN/run.json`; `TrainError` naming the directory when it is not a run."""
    root = Path(path)
    file = root / RUN_FILE
    if not root.is_dir():
        raise TrainError(f"run directory {str(root)!r} does not exist")
    if not file.is_file():
        raise TrainError(
            f"{str(root)!r} is not a run directory: it has no {RUN_FILE} (lmcore train writes "
            "one when a run starts)"
        )
    return read_versioned(
        file,
        format=RUN_FORMAT,
        version=RUN_VERSION,
        what="an lmcore run description",
        error=TrainError,
    )


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """`data` as indented JSON, written atomically."""
    with atomic_write(path, "w") as f:
        f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


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


def step_dir(step: int) -> str:
    return f"step-{step:06d}"


def checkpoints(run: str | os.PathLike[str]) -> list[Checkpoint]:
    """The complete checkpoints of a run (every file present), oldest first. Hidden
    directories of interrupted saves are not among them."""
    root = Path(run) / CHECKPOINTS
    found = []
    with contextlib.suppress(FileNotFoundError):
        for d in root.iterdir():
            m = _STEP_DIR.fullmatch(d.name)
            if m and d.is_dir() and all((d / f).is_file() for f in CHECKPOINT_FILES):
                found.append(Checkpoint(d, int(m.group(1))))
    return sorted(found, key=lambda c: c.step)


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


def tokenizer_of(model_file: str | os.PathLike[str]) -> Path | None:
    """The tokenizer a model file written by the runner names in its metadata (`train.tokenizer`,
    relative to the file), when that file exists; None for a model saved otherwise."""
    from lmcore.checkpoint import read_info

    p = Path(model_file)
    rel = read_info(p).metadata.get(META_TOKENIZER)
    if rel is None:
        return None
    found = p.parent / rel
    return found if found.is_file() else None


def find_model(path: str | os.PathLike[str]) -> tuple[Path, Path | None]:
    """`(model file, tokenizer.json or None)` for a run directory (its latest checkpoint), a
    checkpoint directory, or a model `.safetensors` file. `TrainError` when there is none."""
    p = Path(path)
    if p.is_file():
        return p, tokenizer_of(p)
    if is_run(p):
        last = latest_checkpoint(p)
        if last is None:
            raise TrainError(
                f"run {str(p)!r} has no checkpoint yet (it saves every --save-every steps, at "
                f"the end and when interrupted); resume it: lmcore train --resume {p}"
            )
        return last.model, tokenizer_of(last.model) or _existing(p / TOKENIZER_FILE)
    if (p / MODEL_FILE).is_file():
        model = p / MODEL_FILE
        return model, tokenizer_of(model) or _existing(p / TOKENIZER_FILE)
    raise TrainError(
        f"{str(p)!r} is neither a model file, a checkpoint directory (holding {MODEL_FILE}) nor "
        f"a run directory (holding {RUN_FILE})"
    )


def _existing(p: Path) -> Path | None:
    return p if p.is_file() else None
