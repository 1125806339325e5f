"""`lmcore sweep --launcher ray`: every run a normal `lmcore train` in a Ray task, the same
numbers as in this process, an interrupted run resumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcore.train.launch import LauncherOptions
from lmcore.train.runs import read_metrics
from lmcore.train.sweep import sweep
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import interrupted_sweep, sweep_config, sweep_val_losses

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = sweep_config()
RAY = "needs the 'ray' extra: pip install -e '.[ray]'"


@pytest.mark.slow  # starting a local Ray and its tasks: ~20-25 s
def test_ray_runs_give_the_same_numbers_and_resume(
    tiny_data: Path, tmp_path: Path, reference: dict[str, list[float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    pytest.importorskip("ray", reason=RAY)
    out = tmp_path / "ray"
    interrupted_sweep(tiny_data, out, ["pos=nope"], monkeypatch)
    lines: list[str] = []
    result = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG,
                   launcher=LauncherOptions("ray"), echo=lines.append)  # fmt: skip
    base = result.rows[0]
    # one thread per task by default: the numbers of this process's one-thread sweep, the
    # interrupted baseline resumed from its checkpoint at step 7 included
    assert sweep_val_losses(result) == reference
    assert [m["event"] for m in read_metrics(base.run) if m["kind"] == "event"] == [
        "start", "interrupted", "resume", "done",
    ]  # fmt: skip
    assert "ray: 2 tasks on a local Ray (1 CPU, 0 GPU and 1 threads each)" in "\n".join(lines)
    log = (out / "logs" / f"{Path(base.run).name}.log").read_text()
    assert log.startswith(f"$ lmcore train --resume {Path(base.run).resolve()} --data ")
    lines.clear()  # again, here: nothing is trained twice
    again = sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG, echo=lines.append)
    assert sweep_val_losses(again) == reference and sum("before, kept" in x for x in lines) == 2
