"""`--launcher local`: the runs one after another in this process, with the trainer's report.

Ctrl-C (or SIGTERM) stops the run under way with a checkpoint and ends the sweep there; the
same command again resumes that run and goes on. `threads` sets torch's thread count for the
sweep (restored after).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from lmcore.train.launch.base import Finished, LauncherOptions, Outcome, RunTask


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `threads` inside (unchanged for None)."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class LocalLauncher:
    def __init__(
        self, options: LauncherOptions, echo: Callable[[str], None], progress: bool | None
    ):
        self.options, self.echo, self.progress = options, echo, progress

    def check(self) -> None:
        """Nothing to check: the runs execute here."""

    def run(self, tasks: Sequence[RunTask], data: Path, finished: Finished) -> str | None:
        from lmcore.data.tokens import TokenData
        from lmcore.train import trainer  # looked up at each call, so tests can stand in

        tokens = TokenData.open(data)
        with torch_threads(self.options.run_threads()):
            for n, task in enumerate(tasks, 1):
                self.echo(f"[{n}/{len(tasks)}] {task.label}, seed {task.seed}: {task.spec}")
                try:
                    if task.action == "resume":
                        result = trainer.resume(task.run, data=tokens, echo=self.echo,
                                                progress=self.progress)  # fmt: skip
                    else:
                        result = trainer.train(task.spec, tokens, task.run, task.config,
                                               echo=self.echo, progress=self.progress)  # fmt: skip
                except Exception as e:  # one run failing (out of memory, a bug) ends only it
                    message = _one_line(e)
                    self.echo(f"  {task.label}, seed {task.seed} failed: {message}")
                    finished(task, Outcome(error=message))
                    continue
                if result.status == "interrupted":
                    stopped = result.reason or "interrupted"
                    finished(task, Outcome(interrupted=stopped))
                    return stopped
                finished(task, Outcome())
        return None


def _one_line(e: Exception) -> str:
    """What a failed run reports: lmcore's own message (out of memory names the batch; a run
    in use names its holder), else the exception's type and first line (a plugin's bug)."""
    from lmcore.errors import LmcoreError

    if isinstance(e, LmcoreError):
        return "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return f"{type(e).__name__}: {e}".splitlines()[0]
