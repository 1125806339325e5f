"""What every launcher shares: the options, a run to do (`RunTask`), how it ended (`Outcome`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from lmcore.errors import TrainError, did_you_mean

LAUNCHERS: Final = ("local", "submitit", "ray")
CLUSTERS: Final = ("slurm", "local", "debug")  # submitit's executors
DEFAULT_SLURM_MINUTES: Final = 60
# Bounds on what a run may ask for: past them a number is a typo (a Ray task asking for more
# than any node has waits forever, a SLURM job is refused only once queued).
MAX_THREADS: Final = 1024  # threads and CPUs per run
MAX_GPUS: Final = 64  # GPUs per run


@dataclass(frozen=True)
class LauncherOptions:
    """How and where the runs execute; none of it changes the sweep's numbers but `threads`."""

    name: str = "local"
    threads: int | None = None  # torch's intra-op threads per run (None: see `run_threads`)
    cpus_per_run: int | None = None  # Ray's num_cpus (default 1), SLURM's --cpus-per-task
    gpus_per_run: int = 0  # Ray's num_gpus, SLURM's --gpus-per-node
    slurm_partition: str | None = None
    slurm_time: str | None = None  # minutes, or [D-]HH:MM[:SS]
    slurm_extra: Mapping[str, str] = field(default_factory=dict)  # more #SBATCH options
    slurm_cluster: str = "slurm"  # submitit's executor: slurm, local or debug
    ray_address: str | None = None  # None: a local Ray for the sweep

    def check(self) -> None:
        if self.name not in LAUNCHERS:
            raise TrainError(
                f"--launcher {self.name!r}: must be one of {', '.join(LAUNCHERS)}"
                f"{did_you_mean(self.name, LAUNCHERS)}"
            )
        if self.slurm_cluster not in CLUSTERS:
            raise TrainError(
                f"slurm cluster {self.slurm_cluster!r}: must be one of {', '.join(CLUSTERS)} "
                "(submitit's executors)"
            )
        for name, value in (("threads", self.threads), ("cpus-per-run", self.cpus_per_run)):
            whole = isinstance(value, int) and not isinstance(value, bool)
            if value is not None and (not whole or not 1 <= value <= MAX_THREADS):
                raise TrainError(f"--{name} {value}: must be an integer from 1 to {MAX_THREADS}")
        gpus = self.gpus_per_run
        if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= MAX_GPUS:
            raise TrainError(f"--gpus-per-run {gpus}: must be an integer from 0 to {MAX_GPUS}")
        if self.slurm_time is not None:
            slurm_minutes(self.slurm_time)

    def run_threads(self) -> int | None:
        """The torch threads a run gets: `threads`, else the CPUs a Ray or SLURM run holds
        (one for Ray unless told otherwise); None: torch's default (local runs)."""
        if self.threads is not None:
            return self.threads
        if self.name == "ray":
            return self.cpus_per_run or 1
        if self.name == "submitit":
            return self.cpus_per_run
        return None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "threads": self.threads, "cpus_per_run": self.cpus_per_run,
                "gpus_per_run": self.gpus_per_run, "slurm_partition": self.slurm_partition,
                "slurm_time": self.slurm_time, "slurm_extra": dict(self.slurm_extra),
                "slurm_cluster": self.slurm_cluster,
                "ray_address": self.ray_address}  # fmt: skip


def slurm_minutes(text: str) -> int:
    """SLURM's time formats (`90`, `90:00`, `1:30:00`, `1-06:00:00`, `2-12`) in whole
    minutes, rounded up; `TrainError` for anything else."""
    m = re.fullmatch(r"\s*(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\s*", str(text))
    if m is None:
        raise TrainError(
            f"--slurm-time {text!r}: expected minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]] "
            "(e.g. 90 or 1:30:00)"
        )
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = days * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = (a or 0) * 3600 + (b or 0) * 60 + c
    elif b is not None:  # MM:SS
        seconds = (a or 0) * 60 + b
    else:  # MM
        seconds = (a or 0) * 60
    if seconds <= 0:
        raise TrainError(f"--slurm-time {text!r}: must be longer than zero")
    return math.ceil(seconds / 60)


@dataclass(frozen=True)
class RunTask:
    """One run of a sweep: a variant under one seed, its directory, and what to do there."""

    label: str
    seed: int
    run: Path
    spec: str  # canonical
    config: Any  # TrainConfig, with this seed
    action: str  # "train" (a new run) or "resume" (from its last checkpoint)

    @property
    def name(self) -> str:
        return self.run.name

    def argv(self, data: str | Path) -> list[str]:
        """The `lmcore train` arguments that do this task (absolute paths: the process may
        start in another directory)."""
        run, data = Path(self.run).resolve(), Path(data).resolve()
        if self.action == "resume":
            return ["train", "--resume", str(run), "--data", str(data)]
        return ["train", self.spec, "--data", str(data), "--out", str(run),
                *self.config.cli_args()]  # fmt: skip


@dataclass(frozen=True)
class Outcome:
    """How a task ended, as far as its launcher knows: the run's own run.json says the rest
    (done, diverged, the losses). `error`: why it failed; `interrupted`: the signal or reason
    that stopped it."""

    error: str | None = None
    interrupted: str | None = None


Finished = Callable[[RunTask, Outcome], None]


class Launcher(Protocol):
    def check(self) -> None:
        """`TrainError` when the runs cannot execute where the options say (no SLURM here,
        a Ray address that does not answer): before the sweep claims its directory."""
        ...

    def run(self, tasks: Sequence[RunTask], data: Path, finished: Finished) -> str | None:
        """Execute `tasks`, calling `finished` after each; the reason the sweep stopped
        early (a signal), or None."""
        ...
