"""Where the runs of a sweep execute: `local` (one after another in this process), `submitit`
(a SLURM job array, or submitit's local executor) or `ray` (one Ray task per run).

    tasks = [RunTask(...), ...]                  # what lmcore.train.sweep plans
    launcher = make_launcher(LauncherOptions("ray", cpus_per_run=1))
    stopped = launcher.run(tasks, data, finished)   # finished(task, outcome) after each run

Every run is a normal `lmcore train` writing its own run directory: in this process for
`local` (the trainer's own functions, with its output), else `python -m lmcore train ...` in a
process of its own (`lmcore.train.launch.process`) whose output goes to `SWEEP/logs/RUN.log`.
A run is given the same options whatever runs it, so its numbers are the same under every
launcher when torch uses the same number of threads (`threads`; Ray and SLURM runs default to
their CPUs per run, and a Ray run to one CPU). A run that fails is reported with its reason and
the others go on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lmcore.train.launch.base import (
    CLUSTERS,
    LAUNCHERS,
    MAX_GPUS,
    MAX_THREADS,
    Finished,
    Launcher,
    LauncherOptions,
    Outcome,
    RunTask,
    slurm_minutes,
)

__all__ = [
    "CLUSTERS",
    "LAUNCHERS",
    "MAX_GPUS",
    "MAX_THREADS",
    "Finished",
    "Launcher",
    "LauncherOptions",
    "Outcome",
    "RunTask",
    "make_launcher",
    "slurm_minutes",
]


def make_launcher(
    options: LauncherOptions,
    sweep_dir: Path,
    echo: Callable[[str], None],
    progress: bool | None = None,
) -> Launcher:
    """The launcher `options` names, for the sweep in `sweep_dir`."""
    options.check()
    if options.name == "local":
        from lmcore.train.launch.local import LocalLauncher

        return LocalLauncher(options, echo, progress)
    if options.name == "submitit":
        from lmcore.train.launch.slurm import SubmititLauncher

        return SubmititLauncher(options, sweep_dir, echo)
    from lmcore.train.launch.ray import RayLauncher

    return RayLauncher(options, sweep_dir, echo)
