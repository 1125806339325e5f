"""`--launcher ray`: one Ray task per run, with its CPUs and GPUs declared.

With `ray_address` the sweep joins that cluster (`ray.init(address=...)`, e.g. `auto` on a
node of it); without, it starts a local Ray for the sweep and stops it at the end. Each task
runs `python -m lmcore train ...` (`lmcore.train.launch.process`) on a node that sees the
sweep directory and the data at the same paths (a shared filesystem), with `OMP_NUM_THREADS`
set to the run's threads (its CPUs, one by default). Ctrl-C cancels the tasks: each run saves
a checkpoint and stops, and the same command again resumes them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lmcore.errors import TrainError
from lmcore.train.launch.base import Finished, LauncherOptions, Outcome, RunTask
from lmcore.train.launch.process import outcome_of, run_command

EXTRA = "needs the 'ray' extra: pip install -e '.[ray]' (or pip install 'ray[default]')"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise TrainError(f"--launcher ray {EXTRA}") from None
    return ray


def _task(argv: list[str], log: str, threads: int | None) -> int:
    """What a Ray worker runs: the command, its exit status back."""
    return run_command(argv, log, threads)


class RayLauncher:
    def __init__(self, options: LauncherOptions, sweep_dir: Path, echo: Callable[[str], None]):
        self.options, self.logs, self.echo = options, sweep_dir / "logs", echo

    def run(self, tasks: Sequence[RunTask], data: Path, finished: Finished) -> str | None:
        if not tasks:
            return None
        ray = _import_ray()
        opts = self.options
        started = not ray.is_initialized()
        if started:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=opts.ray_address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)  # fmt: skip
        where = opts.ray_address or "a local Ray"
        resources = {"num_cpus": opts.cpus_per_run or 1, "num_gpus": opts.gpus_per_run}
        remote = ray.remote(max_retries=0, **resources)(_task)
        threads = opts.run_threads()
        pending: dict[Any, RunTask] = {}
        try:
            for task in tasks:
                log = self.logs / f"{task.name}.log"
                ref = remote.remote(task.argv(data), str(log.resolve()), threads)
                pending[ref] = task
            self.echo(
                f"ray: {len(tasks)} tasks on {where} ({resources['num_cpus']} CPU, "
                f"{resources['num_gpus']} GPU and {threads} threads each); logs in {self.logs}"
            )
            while pending:
                [ref], _ = ray.wait(list(pending), num_returns=1)
                task = pending.pop(ref)
                try:
                    outcome = outcome_of(ray.get(ref), self.logs / f"{task.name}.log")
                except Exception as e:  # the task itself failed: a worker died, ...
                    outcome = Outcome(error=f"{type(e).__name__}: {e}".splitlines()[0])
                finished(task, outcome)
        except KeyboardInterrupt:
            for ref in pending:  # each run gets SIGTERM: a checkpoint, then it stops
                ray.cancel(ref)
            for ref, task in pending.items():
                with contextlib.suppress(Exception):  # cancelled, as asked
                    ray.get(ref, timeout=120)
                finished(task, Outcome(interrupted="SIGINT"))
            return "SIGINT"
        finally:
            if started:
                ray.shutdown()
        return None
