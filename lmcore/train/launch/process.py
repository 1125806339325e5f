"""One run as a process of its own: `python -m lmcore train ...`, its output in a log file.

    code = run_command(task.argv(data), log, threads=1)    # in a Ray task or a SLURM job
    outcome = outcome_of(code, log)

The Ray and submitit launchers run this function where the run executes. The command gets
`OMP_NUM_THREADS` (and torch its thread count from it) when `threads` is given. If the caller
is interrupted, or the process that started it dies (Linux: the parent-death signal), the run
gets SIGTERM, saves a checkpoint and stops, so the next attempt resumes it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from lmcore.train.launch.base import Outcome

SIGNALS: Final = {130: "SIGINT", 143: "SIGTERM", -2: "SIGINT", -15: "SIGTERM"}
_ERROR = re.compile(r"^lmcore train: error: (.*)$")


def _end_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_command(argv: Sequence[str], log: str | os.PathLike[str], threads: int | None) -> int:
    """Run `python -m lmcore ARGV` with its output appended to `log`; its exit status."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    path = Path(log)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as out:
        out.write(f"$ lmcore {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcore", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_end_with_parent if sys.platform == "linux" else None,
        )
        try:
            return proc.wait()
        except BaseException:  # cancelled: the run checkpoints and stops, then we go
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            raise


def reason(log: str | os.PathLike[str]) -> str:
    """Why a run failed, from its log: its `lmcore train: error: ...` line, else the last
    line (a traceback's exception)."""
    try:
        lines = Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return "no log was written"
    for line in reversed(lines):
        m = _ERROR.match(line)
        if m:
            return m[1]
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last or "it printed nothing"


def outcome_of(code: int, log: str | os.PathLike[str]) -> Outcome:
    """A finished command's outcome: 0 and 1 are a run that ended (done or diverged, as its
    run.json says); 130 and 143 a run stopped by a signal; anything else a failure."""
    if code in (0, 1) and not _failed_with_traceback(log):
        return Outcome()
    if code in SIGNALS:
        return Outcome(interrupted=SIGNALS[code])
    return Outcome(error=f"exit status {code}: {reason(log)}")


def _failed_with_traceback(log: str | os.PathLike[str]) -> bool:
    """Whether the last command in `log` ended in a Python traceback (exit status 1 too)."""
    try:
        text = Path(log).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    return "Traceback (most recent call last)" in text[text.rfind("\n$ lmcore ") + 1 :]
