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
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from lmcore.errors import TrainError
from lmcore.train.endpoints import probe_grpc
from lmcore.train.launch.base import Finished, LauncherOptions, Outcome, RunTask
from lmcore.train.launch.process import outcome_of, run_command

EXTRA = "needs the 'ray' extra: pip install -e '.[ray]' (or pip install 'ray[default]')"
# AF_UNIX socket paths hold at most 107 bytes on Linux (108 with the NUL; 103 on macOS); a
# local Ray puts its sockets under RAY_TMPDIR (else TMPDIR, else /tmp), in
# ray/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store, the longest name.
SOCKET_MAX: Final = 103 if sys.platform == "darwin" else 107
_SESSION: Final = "session_YYYY-MM-DD_HH-MM-SS_ffffff_"
_ADDRESS_FIX: Final = (
    "give the address of a running Ray cluster's head (ray start --head prints it), auto on a "
    "node of one, or leave out --ray-address for a local Ray"
)


def socket_path_length(pid: int | None = None) -> tuple[str, int]:
    """Where a local Ray started by this process puts its longest socket path (the variable
    that decides it), and that path's length in bytes."""
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if os.environ.get(var):
            base, source = os.environ[var], var
            break
    else:
        base, source = "/tmp", "the default /tmp"
    session = f"{_SESSION}{os.getpid() if pid is None else pid}"
    path = os.path.join(base, "ray", session, "sockets", "plasma_store")
    return source, len(path.encode("utf-8", "surrogateescape"))


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

    def address(self) -> str | None:
        """The cluster the sweep joins: --ray-address, else RAY_ADDRESS (as ray.init reads
        it); None: a local Ray."""
        return self.options.ray_address or os.environ.get("RAY_ADDRESS") or None

    def check(self, timeout: float | None = None) -> None:
        """`TrainError` before anything starts: for a local Ray, socket paths too long for
        AF_UNIX; for a cluster's address, that it answers (a connect and a gRPC handshake,
        each within `timeout`, default `CONNECT_TIMEOUT_S`): ray.init itself waits minutes."""
        _import_ray()
        address = self.address()
        if address is None:
            source, length = socket_path_length()
            if length > SOCKET_MAX:
                value = os.environ.get(source, "")
                raise TrainError(
                    f"--launcher ray: a local Ray's socket paths under {source} "
                    f"{value!r} would be {length} bytes, longer than AF_UNIX's limit of "
                    f"{SOCKET_MAX} bytes; set {source} to a shorter directory (e.g. "
                    f"{source}=/tmp), or join a running cluster with --ray-address"
                )
            return
        if address in ("auto", "local"):
            return  # Ray finds the cluster (or says there is none) without waiting
        what = f"--ray-address {address}"
        if self.options.ray_address is None:
            what = f"RAY_ADDRESS {address}"
        probe_grpc(address, what, _ADDRESS_FIX, timeout)

    def run(self, tasks: Sequence[RunTask], data: Path, finished: Finished) -> str | None:
        if not tasks:
            return None
        ray = _import_ray()
        opts = self.options
        started = not ray.is_initialized()
        if started:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            try:
                ray.init(address=opts.ray_address, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)  # fmt: skip
            except Exception as e:  # Ray's own: ConnectionError, RuntimeError, OSError, ...
                first = next((x for x in str(e).splitlines() if x.strip()), type(e).__name__)
                where = self.address() or "a local Ray"
                raise TrainError(f"--launcher ray: Ray did not start on {where}: {first}") from None
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
