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


def test_a_local_rays_socket_paths_are_checked_before_anything_starts(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray", reason=RAY)
    from lmcore.errors import TrainError
    from lmcore.train.launch.ray import SOCKET_MAX, RayLauncher, socket_path_length
    from tests.helpers.errors import raises_naming

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # ray/session_YYYY-MM-DD_HH-MM-SS_ffffff_<pid>/sockets/plasma_store under the variable
    tail = len("/ray/session_2026-12-02_03-21-31_358444_/sockets/plasma_store") + len("4242")
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")
    assert socket_path_length(4242) == ("RAY_TMPDIR", len("/tmp") + tail)
    long = str(tmp_path / ("t" * 110))
    monkeypatch.setenv("RAY_TMPDIR", long)
    out = tmp_path / "sw"
    with raises_naming(TrainError, f"RAY_TMPDIR {long!r}", f"AF_UNIX's limit of {SOCKET_MAX} bytes",
                       "set RAY_TMPDIR to a shorter directory"):  # fmt: skip
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG,
              launcher=LauncherOptions("ray"), echo=None)  # fmt: skip
    assert not out.exists() and SOCKET_MAX in (103, 107)
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")
    RayLauncher(LauncherOptions("ray"), out, print).check()  # a short one passes


def test_a_ray_address_that_does_not_answer_is_one_line_before_anything_starts(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray", reason=RAY)
    import time

    from lmcore.errors import TrainError
    from lmcore.train import endpoints
    from tests.helpers.errors import raises_naming
    from tests.helpers.net import closed_port, silent_port

    monkeypatch.setattr(endpoints, "CONNECT_TIMEOUT_S", 1.0)
    out = tmp_path / "sw"
    address = f"127.0.0.1:{closed_port()}"
    with raises_naming(TrainError, f"--ray-address {address}: cannot connect", "refused",
                       "leave out --ray-address for a local Ray"):  # fmt: skip
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG,
              launcher=LauncherOptions("ray", ray_address=address), echo=None)  # fmt: skip
    with silent_port() as port:
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # as ray.init would read it
        start = time.monotonic()
        with raises_naming(TrainError, f"RAY_ADDRESS 127.0.0.1:{port}",
                           "does not answer within 1 s"):  # fmt: skip
            sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, CONFIG,
                  launcher=LauncherOptions("ray"), echo=None)  # fmt: skip
        assert time.monotonic() - start < 10
    assert not out.exists()
