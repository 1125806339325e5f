"""`--launcher submitit`: the runs as one SLURM job array through submitit, one job per run.

Each job runs `python -m lmcore train ...` (`lmcore.train.launch.process`) with the Python that
submitted it, so the sweep directory, the data and the environment must be on a filesystem the
nodes share. The options map onto sbatch's: `slurm_partition` (`--partition`), `slurm_time`
(`--time`, default 60 minutes), `gpus_per_run` (`--gpus-per-node`), `cpus_per_run`
(`--cpus-per-task`, and the run's threads), and `slurm_extra` (`KEY=VALUE`, any other
`#SBATCH --KEY=VALUE`). submitit's own files (the sbatch script, the pickles and logs of each
job) go to `SWEEP/slurm/`.

`slurm_cluster = "local"` uses submitit's local executor instead: each run a process on this
machine, the same code path without a cluster (what the tests use). The sweep process waits
for the jobs and writes the table as they finish; if it is stopped, jobs on SLURM go on, and
the same command again waits for those still queued or running instead of submitting them
twice (their ids are kept in `SWEEP/slurm/jobs.json`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from lmcore.errors import TrainError
from lmcore.train.launch.base import (
    DEFAULT_SLURM_MINUTES,
    Finished,
    LauncherOptions,
    Outcome,
    RunTask,
    slurm_minutes,
)
from lmcore.train.launch.process import outcome_of, run_command

EXTRA: Final = "needs the 'slurm' extra: pip install -e '.[slurm]' (or pip install submitit)"
JOBS_FILE: Final = "jobs.json"
POLL_S: Final = 2.0


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise TrainError(f"--launcher submitit {EXTRA}") from None
    return submitit


def executor_parameters(options: LauncherOptions, name: str = "lmcore-sweep") -> dict[str, Any]:
    """submitit's `AutoExecutor.update_parameters` for `options`."""
    minutes = slurm_minutes(options.slurm_time) if options.slurm_time else DEFAULT_SLURM_MINUTES
    params: dict[str, Any] = {"name": name, "timeout_min": minutes, "nodes": 1,
                              "tasks_per_node": 1}  # fmt: skip
    if options.gpus_per_run:
        params["gpus_per_node"] = options.gpus_per_run
    if options.cpus_per_run:
        params["cpus_per_task"] = options.cpus_per_run
    if options.slurm_partition:
        params["slurm_partition"] = options.slurm_partition
    if options.slurm_extra:
        params["slurm_additional_parameters"] = dict(options.slurm_extra)
    return params


def _run(argv: list[str], log: str, threads: int | None) -> int:
    """What a job runs: the command, its exit status back."""
    return run_command(argv, log, threads)


class SubmititLauncher:
    def __init__(self, options: LauncherOptions, sweep_dir: Path, echo: Callable[[str], None]):
        self.options, self.echo = options, echo
        self.folder, self.logs = sweep_dir / "slurm", sweep_dir / "logs"

    def check(self) -> None:
        """On `slurm_cluster = "slurm"`, that SLURM's commands are here (submitit needs both
        `sbatch` and `srun`); the extra installed."""
        _import_submitit()
        if self.options.slurm_cluster != "slurm":
            return
        missing = [cmd for cmd in ("sbatch", "srun") if shutil.which(cmd) is None]
        if missing:
            raise TrainError(
                "--launcher submitit: this machine is not part of a SLURM cluster "
                f"({' and '.join(missing)} not on PATH); run the sweep from a login node of "
                "the cluster, or here with --launcher local (or ray), or submitit's local "
                'executor with cluster = "local" under [launcher.slurm] in a sweep file'
            )

    def _jobs(self) -> dict[str, str]:
        try:
            found = json.loads((self.folder / JOBS_FILE).read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    def _save_jobs(self, jobs: dict[str, str]) -> None:
        from lmcore.train.runs import write_json

        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / JOBS_FILE, jobs)

    def submit(self, tasks: Sequence[RunTask], data: Path) -> dict[str, Any]:
        """Submit `tasks` (one job array), except those whose job from an earlier sweep
        process is still queued or running on SLURM; each task's job by the task's name."""
        submitit = _import_submitit()
        opts = self.options
        running: dict[str, Any] = {}
        recorded = self._jobs()
        if opts.slurm_cluster == "slurm":
            for task in tasks:
                if task.name in recorded:
                    job = submitit.SlurmJob(folder=self.folder, job_id=recorded[task.name])
                    if not job.done():
                        running[task.name] = job
                        self.echo(f"  {task.label}, seed {task.seed}: job {job.job_id} again")
        new = [t for t in tasks if t.name not in running]
        if new:
            executor = submitit.AutoExecutor(folder=self.folder, cluster=opts.slurm_cluster)
            executor.update_parameters(**executor_parameters(opts))
            threads = opts.run_threads()
            with executor.batch():
                jobs = [
                    executor.submit(_run, t.argv(data),
                                    str((self.logs / f"{t.name}.log").resolve()), threads)
                    for t in new
                ]  # fmt: skip
            running.update({t.name: job for t, job in zip(new, jobs, strict=True)})
            self._save_jobs({**recorded, **{t: str(j.job_id) for t, j in running.items()}})
        return running

    def run(self, tasks: Sequence[RunTask], data: Path, finished: Finished) -> str | None:
        if not tasks:
            return None
        opts = self.options
        on_slurm = opts.slurm_cluster == "slurm"
        running = self.submit(tasks, data)
        ids = ", ".join(str(running[t.name].job_id) for t in tasks)
        self.echo(f"submitit ({opts.slurm_cluster}): {len(tasks)} jobs ({ids}); "
                  f"logs in {self.logs} and {self.folder}")  # fmt: skip
        by_name = {t.name: t for t in tasks}
        try:
            while running:
                for name, job in list(running.items()):
                    if job.done():
                        del running[name]
                        finished(by_name[name], self._outcome(by_name[name], job))
                if running:
                    time.sleep(POLL_S)
        except KeyboardInterrupt:
            if on_slurm:
                self.echo("the jobs go on on the cluster; the same command again waits for them")
                return "SIGINT"
            for job in running.values():  # local processes: each run checkpoints and stops
                job.cancel(check=False)
            for name in running:
                finished(by_name[name], Outcome(interrupted="SIGINT"))
            return "SIGINT"
        return None

    def _outcome(self, task: RunTask, job: Any) -> Outcome:
        log = self.logs / f"{task.name}.log"
        try:
            return outcome_of(int(job.result()), log)
        except Exception as e:  # the job failed around the command: timeout, a node lost
            text = str(e).strip().splitlines()
            return Outcome(error=f"job {job.job_id} failed: {text[-1] if text else type(e)}")
