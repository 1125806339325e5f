"""A run in a process of its own: its outcome from its exit status and the last words of its
log (the one-line error, or the exception a traceback ends with)."""

from __future__ import annotations

from pathlib import Path

from lmcore.train.launch.process import outcome_of, reason


def test_failure_reasons(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("$ lmcore train x\nlmcore train: error: --lr -1: must be a number > 0\n")
    assert reason(log) == "--lr -1: must be a number > 0"
    assert outcome_of(2, log).error == "exit status 2: --lr -1: must be a number > 0"
    assert outcome_of(143, log).interrupted == "SIGTERM" and outcome_of(0, log).error is None
    log.write_text("$ lmcore train x\nTraceback (most recent call last):\n  ...\nMemoryError\n")
    assert outcome_of(1, log).error == "exit status 1: MemoryError"
