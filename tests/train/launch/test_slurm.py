"""`lmcore sweep --launcher submitit`: the sbatch array carries the options given; submitit's
local executor gives the same numbers as this process, reports failures and resumes an
interrupted run."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from lmcore.train.launch import LauncherOptions, RunTask
from lmcore.train.sweep import plan, sweep
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import interrupted_sweep, sweep_config, sweep_val_losses

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = sweep_config()
SLURM = "needs the 'slurm' extra: pip install -e '.[slurm]'"


def stray(out: Path, change: str) -> Path:
    """A non-empty directory where `change`'s run of seed 0 goes: `lmcore train` refuses it."""
    run = out / plan(TINY_SPEC, [change])[1].run_name(0)
    run.mkdir(parents=True)
    (run / "stray.txt").write_text("not a run")
    return run


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
    interrupted_sweep(tiny_data, out, changes, monkeypatch)
    bad = stray(out, "ffn=silu")
    options = LauncherOptions("submitit", threads=1, slurm_cluster="local", slurm_time="10")
    lines: list[str] = []
    result = sweep(TINY_SPEC, changes, tiny_data, out, CONFIG, launcher=options,
                   echo=lines.append)  # fmt: skip
    assert sweep_val_losses(result) == reference
    assert [r.state for r in result.rows] == ["done", "done", "failed"]
    assert result.rows[2].error == (
        f"exit status 2: --out {bad} is not an empty directory and holds no run; choose a new "
        "or empty directory for the run"
    )
    assert "submitit (local): 3 jobs (" in "\n".join(lines)
    assert f"  ffn=silu, seed 0: failed: {result.rows[2].error}" in lines


def test_submitit_off_a_cluster_is_one_line_naming_what_to_use_instead(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("submitit", reason=SLURM)
    from lmcore.errors import TrainError
    from lmcore.train.launch.slurm import SubmititLauncher
    from tests.helpers.errors import raises_naming

    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch, no srun
    out = tmp_path / "sw"
    with raises_naming(TrainError, "not part of a SLURM cluster", "sbatch and srun not on PATH",
                       "--launcher local", 'cluster = "local"'):  # fmt: skip
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG,
              launcher=LauncherOptions("submitit"), echo=None)  # fmt: skip
    assert not out.exists()
    SubmititLauncher(LauncherOptions("submitit", slurm_cluster="local"), out, print).check()
    fake_slurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    SubmititLauncher(LauncherOptions("submitit"), out, print).check()  # SLURM's commands here
