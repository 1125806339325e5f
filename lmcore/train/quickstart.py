"""`lmcore quickstart`: train a small model on text every machine has, in about a minute.

The text is the running Python's own standard library (`sysconfig.get_paths()["stdlib"]`, the
`.py` files without `site-packages` and `test`: about 860 files, 13 MB on Python 3.11). It is
tokenised once with a 2,048-token byte-level BPE into `data/stdlib-2k` (reused when it is
there), then `QUICKSTART_SPEC`, a 1.3M-parameter model of the default components, trains for
`QUICKSTART_STEPS` steps while the validation loss is printed as it falls. Both steps are the
ordinary commands; `commands()` spells them out.
"""

from __future__ import annotations

import os
import shlex
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from lmcore.errors import DataError

QUICKSTART_SPEC: Final = (
    "vocab_size=2048, context_length=128, d_model=128, num_layers=4, num_heads=4"
)
QUICKSTART_VOCAB: Final = 2048
QUICKSTART_STEPS: Final = 200
QUICKSTART_DATA: Final = Path("data/stdlib-2k")
QUICKSTART_RUN: Final = Path("runs/quickstart")
EXCLUDE: Final = ("site-packages", "test")
# Options of the run: a short warmup and a high peak for a short run of a small model.
OPTIONS: Final = {"batch_size": 16, "lr": 3e-3, "eval_every": 20, "eval_batches": 4,
                  "save_every": 0}  # fmt: skip


def stdlib() -> Path:
    """The running Python's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def fresh_run_dir(base: Path) -> Path:
    """`base`, or `base-2`, `base-3`, ... : the first that does not exist or is empty."""
    n = 1
    while True:
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            return path
        n += 1


def commands(data: Path, out: Path, steps: int) -> list[str]:
    """The two ordinary commands that do what `lmcore quickstart` does."""
    excludes = " ".join(f"--exclude {e}" for e in EXCLUDE)
    opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in {"steps": steps, **OPTIONS}.items())
    return [
        f"lmcore data prepare {shlex.quote(str(stdlib()))} --ext .py {excludes} "
        f"--vocab-size {QUICKSTART_VOCAB} --out {data}",
        f"lmcore train {shlex.quote(QUICKSTART_SPEC)} --data {data} --out {out} {opts}",
    ]


def _usable(data: Path) -> bool:
    """Whether `data` holds quickstart data already (prepared from this standard library with
    the quickstart's vocabulary); `DataError` when it holds other data."""
    from lmcore.data.tokens import TokenData

    if not (data / "meta.json").is_file():
        return False
    meta = TokenData.open(data).meta
    if (
        [s.path for s in meta.sources] == [os.path.abspath(stdlib())]
        and meta.extensions == (".py",)
        and meta.exclude == EXCLUDE
        and meta.tokenizer_from is None
    ):
        return True
    raise DataError(
        f"--data {data} holds other prepared data ({meta.vocab_size:,} tokens from "
        f"{', '.join(s.path for s in meta.sources)}); the quickstart prepares its own: choose "
        "another --data"
    )


def one_thread_if_busy(device: str, echo: Callable[[str], None]) -> bool:
    """Train on one torch thread when the CPU is already busy: when the load average reaches the
    core count, torch's OpenMP threads spin-wait on each other for cores that other processes
    hold, and one thread trains the quickstart model several times faster (with the same
    losses). `OMP_NUM_THREADS`, when set, decides instead. Whether it switched."""
    from lmcore.model.inputs import resolve_device

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows)
        return False
    cores = os.cpu_count() or 1
    if "OMP_NUM_THREADS" in os.environ or load < cores or resolve_device(device).type != "cpu":
        return False
    import torch

    if torch.get_num_threads() == 1:
        return False
    torch.set_num_threads(1)
    echo(
        f"threads: 1, as the machine is busy (load average {load:.1f} on {cores} cores); "
        "OMP_NUM_THREADS=N chooses instead"
    )
    return True


def quickstart(
    *,
    data: Path = QUICKSTART_DATA,
    out: Path | None = None,
    steps: int = QUICKSTART_STEPS,
    device: str = "auto",
    echo: Callable[[str], None] = print,
    progress: bool | None = None,
) -> Any:
    """Prepare the standard library (unless `data` holds it) and train the quickstart model
    into `out` (default: `runs/quickstart`, or the next free `runs/quickstart-N`). Returns
    the `TrainResult`."""
    from lmcore.data.preparing import prepare, summary_lines
    from lmcore.train.config import TrainConfig
    from lmcore.train.trainer import train

    run = out if out is not None else fresh_run_dir(QUICKSTART_RUN)
    echo(
        f"quickstart: a small model learns Python from this Python's standard library ({stdlib()})"
    )
    echo("the same, step by step:")
    for line in commands(data, run, steps):
        echo(f"  {line}")
    echo("")
    if _usable(data):
        echo(f"data: {data} holds the standard library already; reusing it")
    else:
        result = prepare(
            [stdlib()],
            data,
            vocab_size=QUICKSTART_VOCAB,
            extensions=(".py",),
            exclude=EXCLUDE,
            progress=progress,
        )
        for line in summary_lines(result):
            echo(line)
    echo("")
    one_thread_if_busy(device, echo)
    config = TrainConfig(steps=steps, device=device, **OPTIONS)  # type: ignore[arg-type]
    return train(QUICKSTART_SPEC, data, run, config, echo=echo, progress=progress)
