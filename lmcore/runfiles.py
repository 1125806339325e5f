"""Where lmcore's files lie: the layout of a run directory, the model file a path names, and the
search for a model's tokenizer.json. Paths only: nothing here reads a model.

    RUN/
      .lock                 held (fcntl.flock) by the process training the run, with its PID
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

    find_checkpoint("runs/quickstart")  # its newest checkpoints/step-NNNNNN/model.safetensors
    with_checkpoint("runs/quickstart", read)  # read(that file), again on the newest if it vanishes
    find_tokenizer(model_file, info.metadata)  # its tokenizer.json, and where it looked

`lmcore.train.runs` writes runs; `lmcore.sources` opens what a command's argument names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from lmcore.errors import CheckpointError, LmcoreError, TrainError
from lmcore.jsonfile import read_versioned

__all__ = [
    "CHECKPOINTS",
    "CHECKPOINT_FILES",
    "HF_CONFIG",
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
    "TokenizerSearch",
    "find_checkpoint",
    "find_tokenizer",
    "hf_hint",
    "is_run",
    "read_run",
    "step_dir",
    "step_dirs",
    "tokenizer_of",
    "with_checkpoint",
]

RUN_FILE: Final = "run.json"
RUN_FORMAT: Final = "lmcore-run"
RUN_VERSION: Final = 1
CHECKPOINTS: Final = "checkpoints"
STEP_DIR: Final = re.compile(r"step-(\d+)")
MODEL_FILE: Final = "model.safetensors"
STATE_TENSORS: Final = "trainer.safetensors"
STATE_JSON: Final = "trainer.json"
TOKENIZER_FILE: Final = "tokenizer.json"  # also a prepared data directory's and a HF model's
CHECKPOINT_FILES: Final = (MODEL_FILE, STATE_TENSORS, STATE_JSON, TOKENIZER_FILE)
METRICS_FILE: Final = "metrics.jsonl"
PLOT_FILE: Final = "loss.png"
HF_CONFIG: Final = "config.json"  # what marks a Hugging Face model directory
# The model file's metadata keys that point back to its run (strings, safetensors metadata).
META_STEP: Final = "train.step"
META_TOKENS: Final = "train.tokens"
META_TAG: Final = "train.tag"
META_TOKENIZER: Final = "train.tokenizer"  # a path relative to the model file's directory
ATTEMPTS: Final = 5  # reads of a run's newest checkpoint before its pruning is given up on

T = TypeVar("T")


# ------------------------------------------------------------------------------ run directories


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


def step_dir(step: int) -> str:
    """The name of a run's checkpoint directory for `step`: `step-NNNNNN`."""
    return f"step-{step:06d}"


def step_dirs(run: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """`(step, directory)` of each checkpoint directory in a run's `checkpoints/`, oldest first
    (hidden directories of interrupted saves are not among them)."""
    found = []
    root = Path(run) / CHECKPOINTS
    if root.is_dir():
        for d in root.iterdir():
            m = STEP_DIR.fullmatch(d.name)
            if m and d.is_dir():
                found.append((int(m.group(1)), d))
    return sorted(found)


# ------------------------------------------------------------------------------ the model file


def hf_hint(directory: Path) -> str:
    """What to say of a directory that is no checkpoint but holds a config.json."""
    if not (directory / HF_CONFIG).is_file():
        return ""
    return (
        f"; it holds a {HF_CONFIG}: for a Hugging Face model directory run "
        f"`lmcore convert --from-hf {directory} OUT.safetensors`"
    )


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The model file that `path` names: the path itself unless it is a directory; a checkpoint
    directory's `model.safetensors`; a run directory's newest checkpoint's. `CheckpointError`
    for a directory that is none of these, or a run with no checkpoint yet."""
    p = Path(path)
    if not p.is_dir():
        return p  # a file, or nothing: `read_header` says which
    if (p / RUN_FILE).is_file():
        saved = [d / MODEL_FILE for _, d in step_dirs(p) if (d / MODEL_FILE).is_file()]
        if not saved:
            raise CheckpointError(
                f"run {str(p)!r} has no checkpoint yet (it saves every --save-every steps, at "
                f"the end and when interrupted); resume it: lmcore train --resume {p}"
            )
        return saved[-1]
    if (p / MODEL_FILE).is_file():
        return p / MODEL_FILE
    raise CheckpointError(
        f"{str(p)!r} is neither a model file, a checkpoint directory (holding {MODEL_FILE}) nor "
        f"a run directory (holding {RUN_FILE}){hf_hint(p)}"
    )


def with_checkpoint(
    path: str | os.PathLike[str], use: Callable[[Path], T], attempts: int = ATTEMPTS
) -> T:
    """`use(find_checkpoint(path))`. A run that is training removes its older checkpoints
    (`lmcore train --keep N`), so the newest one listed may be gone by the time `use` reads it:
    when `use` fails (an `OSError` or an `LmcoreError`) and the file it was given no longer
    exists, the run's newest checkpoint is found and read again, `attempts` times in all, then
    `CheckpointError` saying so. Any other failure, and any of a path that is not a run
    directory, is `use`'s own."""
    for attempt in range(1, attempts + 1):
        file = find_checkpoint(path)
        try:
            return use(file)
        except (OSError, LmcoreError) as e:
            if not is_run(path) or os.path.lexists(file):
                raise
            if attempt == attempts:
                raise CheckpointError(
                    f"run {str(path)!r}: its newest checkpoint was removed while it was read, "
                    f"{attempts} times in a row (the run is pruning its checkpoints, --keep); "
                    "try again, or name a checkpoint directory it keeps"
                ) from e
    raise AssertionError("unreachable: attempts >= 1")  # pragma: no cover


# ------------------------------------------------------------------------------ the tokenizer


def tokenizer_of(model_file: str | os.PathLike[str], metadata: Mapping[str, str]) -> Path | None:
    """The tokenizer a model file written by the runner names in its `metadata`
    (`train.tokenizer`, relative to the file), when that file exists; None for a model saved
    otherwise."""
    rel = metadata.get(META_TOKENIZER)
    if rel is None:
        return None
    found = Path(model_file).parent / rel
    return found if found.is_file() else None


@dataclass(frozen=True)
class TokenizerSearch:
    """Where `find_tokenizer` looked for a model's tokenizer.json, in order, and what it found.
    `problem` says why the run's data directory is unknown (its run.json cannot be read)."""

    found: Path | None
    places: tuple[Path, ...]
    problem: str | None = None

    def looked(self) -> str:
        """`looked for tokenizer.json in DIR, DIR, ...`"""
        return f"looked for {TOKENIZER_FILE} in {', '.join(str(p.parent) for p in self.places)}"

    def unknown(self) -> str:
        """`; the run's data directory is unknown: PROBLEM`, or nothing."""
        return (
            "" if self.problem is None else f"; the run's data directory is unknown: {self.problem}"
        )


def find_tokenizer(
    model_file: str | os.PathLike[str], metadata: Mapping[str, str]
) -> TokenizerSearch:
    """A model file's tokenizer.json: the one its `metadata` names (`tokenizer_of`), else the
    first found beside it, then in each directory up to its run directory (the first holding
    run.json), then in the data directory the run names."""
    p = Path(model_file)
    named = tokenizer_of(p, metadata)
    up, run = [], None
    for d in p.resolve().parents:
        up.append(d / TOKENIZER_FILE)
        if (d / RUN_FILE).is_file():
            run = d
            break
    places = ([] if named is None else [named]) + (up if run is not None else up[:1])
    problem = None
    if run is not None:
        try:
            data = read_run(run).get("data")  # {"path": ...}
        except TrainError as e:
            problem = str(e)
        else:
            path = data.get("path") if isinstance(data, dict) else None
            if isinstance(path, str):
                places.append(Path(path) / TOKENIZER_FILE)
    found = next((t for t in places if t.is_file()), None)
    return TokenizerSearch(found, tuple(places), problem)
