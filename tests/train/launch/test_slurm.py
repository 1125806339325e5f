"""`lmcore sweep --launcher submitit|ray`: every run a normal `lmcore train` in its own process,
the same numbers as in this process, failures reported, interrupted runs resumed, the sbatch
script carrying the options given."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from lmcore.train.config import TrainConfig
from lmcore.train.launch import LauncherOptions, RunTask, slurm_minutes
from lmcore.train.launch.process import outcome_of, reason
from lmcore.train.runs import read_metrics
from lmcore.train.sweep import plan, sweep
from tests.helpers import TINY_SPEC

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = TrainConfig(steps=20, batch_size=8, eval_every=10, eval_batches=2, device="cpu", lr=3e-3)
SLURM = "needs the 'slurm' extra: pip install -e '.[slurm]'"
RAY = "needs the 'ray' extra: pip install -e '.[ray]'"


def losses(result: Any) -> dict[str, list[float]]:
    """Every run's validation losses, evaluation by evaluation, by run directory name."""
    return {
        Path(r.run).name: [m["val_loss"] for m in read_metrics(r.run) if m["kind"] == "eval"]
        for r in result.rows
        if r.state == "done"
    }


@pytest.fixture(scope="module")
def reference(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """The sweep trained here, in this process, on one thread."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("local") / "sweep"
    return losses(sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=None))


def stray(out: Path, change: str) -> Path:
    """A non-empty directory where `change`'s run of seed 0 goes: `lmcore train` refuses it."""
    run = out / plan(TINY_SPEC, [change])[1].run_name(0)
    run.mkdir(parents=True)
    (run / "stray.txt").write_text("not a run")
    return run


def interrupted_baseline(
    tiny_data: Path, out: Path, changes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep started here and stopped (as by Ctrl-C) at step 7 of its first run."""
    from lmcore.train import trainer

    real = trainer.train
    monkeypatch.setattr(trainer, "train", lambda *a, **kw: real(*a, **{**kw, "stop_after": 7}))
    first = sweep(TINY_SPEC, changes, tiny_data, out, CONFIG, echo=None)
    assert first.interrupted == "stop_after" and first.rows[0].step == 7
    monkeypatch.setattr(trainer, "train", real)


def test_ray_runs_give_the_same_numbers_and_resume(
    tiny_data: Path, tmp_path: Path, reference: dict[str, list[float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    pytest.importorskip("ray", reason=RAY)
    out = tmp_path / "ray"
    interrupted_baseline(tiny_data, out, ["pos=nope"], monkeypatch)
    lines: list[str] = []
    result = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG,
                   launcher=LauncherOptions("ray"), echo=lines.append)  # fmt: skip
    base = result.rows[0]
    # one thread per task by default: the numbers of this process's one-thread sweep, the
    # interrupted baseline resumed from its checkpoint at step 7 included
    assert losses(result) == reference
    assert [m["event"] for m in read_metrics(base.run) if m["kind"] == "event"] == [
        "start", "interrupted", "resume", "done",
    ]  # fmt: skip
    assert "ray: 2 tasks on a local Ray (1 CPU, 0 GPU and 1 threads each)" in "\n".join(lines)
    log = (out / "logs" / f"{Path(base.run).name}.log").read_text()
    assert log.startswith(f"$ lmcore train --resume {Path(base.run).resolve()} --data ")
    lines.clear()  # again, here: nothing is trained twice
    again = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=lines.append)
    assert losses(again) == reference and sum("before, kept" in x for x in lines) == 2


def fake_slurm(bin_dir: Path) -> None:
    """`srun` and `sbatch` stand-ins: sbatch answers as SLURM does and runs nothing."""
    bin_dir.mkdir()
    for name, body in (("srun", "exit 0"), ("sbatch", 'echo "Submitted batch job 4242"')):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def test_submitit_writes_an_sbatch_array_with_the_options_given(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("submitit", reason=SLURM)
    from lmcore.train.launch.slurm import SubmititLauncher

    fake_slurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    options = LauncherOptions("submitit", cpus_per_run=4, gpus_per_run=1, slurm_partition="gpu",
                              slurm_time="1:30:00", slurm_extra={"account": "cs336", "qos": "high"})  # fmt: skip
    out = tmp_path / "sweep"
    tasks = [RunTask("baseline", s, out / f"baseline-seed{s}", TINY_SPEC, CONFIG, "train")
             for s in (0, 1)]  # fmt: skip
    jobs = SubmititLauncher(options, out, print).submit(tasks, tiny_data)
    assert [j.job_id for j in jobs.values()] == ["4242_0", "4242_1"]  # one array, a job per run
    script = (out / "slurm" / "4242_submission.sh").read_text()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --time=90", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --cpus-per-task=4", "#SBATCH --account=cs336", "#SBATCH --qos=high",
                 "#SBATCH --array=0-1%", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1"):  # fmt: skip
        assert line in script, line
    recorded = json.loads((out / "slurm" / "jobs.json").read_text())
    assert recorded == {"baseline-seed0": "4242_0", "baseline-seed1": "4242_1"}


def test_submitits_local_executor_gives_the_same_numbers_and_reports_failures(
    tiny_data: Path, tmp_path: Path, reference: dict[str, list[float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    pytest.importorskip("submitit", reason=SLURM)
    out = tmp_path / "submitit"
    changes = ["pos=nope", "ffn=silu"]
    interrupted_baseline(tiny_data, out, changes, monkeypatch)
    bad = stray(out, "ffn=silu")
    options = LauncherOptions("submitit", threads=1, slurm_cluster="local", slurm_time="10")
    lines: list[str] = []
    result = sweep(TINY_SPEC, changes, tiny_data, out, CONFIG, launcher=options,
                   echo=lines.append)  # fmt: skip
    assert losses(result) == reference
    assert [r.state for r in result.rows] == ["done", "done", "failed"]
    assert result.rows[2].error == (
        f"exit status 2: --out {bad} is not an empty directory and holds no run; choose a new "
        "or empty directory for the run"
    )
    assert "submitit (local): 3 jobs (" in "\n".join(lines)
    assert f"  ffn=silu, seed 0: failed: {result.rows[2].error}" in lines


def test_slurm_times_and_failure_reasons(tmp_path: Path) -> None:
    assert [slurm_minutes(t) for t in ("90", "90:30", "1:30:00", "1-06", "2-00:00:30")] == [
        90, 91, 90, 1800, 2881,
    ]  # fmt: skip
    with pytest.raises(Exception, match=r"--slurm-time '1h': expected minutes, MM:SS"):
        slurm_minutes("1h")
    log = tmp_path / "run.log"
    log.write_text("$ lmcore train x\nlmcore train: error: --lr -1: must be a number > 0\n")
    assert reason(log) == "--lr -1: must be a number > 0"
    assert outcome_of(2, log).error == "exit status 2: --lr -1: must be a number > 0"
    assert outcome_of(143, log).interrupted == "SIGTERM" and outcome_of(0, log).error is None
    log.write_text("$ lmcore train x\nTraceback (most recent call last):\n  ...\nMemoryError\n")
    assert outcome_of(1, log).error == "exit status 1: MemoryError"
