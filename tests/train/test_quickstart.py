"""`lmcore quickstart`'s pieces: one thread on a busy machine."""

from __future__ import annotations

import os

import pytest

from lmcore.train import quickstart as qs


def test_quickstart_trains_on_one_thread_on_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    lines: list[str] = []
    threads = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))  # not busy: unchanged
        assert not qs.one_thread_if_busy("cpu", lines.append) and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # busy, but the user chose
        monkeypatch.setattr(os, "getloadavg", lambda: (5.2, 4.0, 3.0))
        assert not qs.one_thread_if_busy("cpu", lines.append) and torch.get_num_threads() == 2
        assert lines == []
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert qs.one_thread_if_busy("cpu", lines.append) and torch.get_num_threads() == 1
        assert lines == [
            "threads: 1, as the machine is busy (load average 5.2 on 2 cores); OMP_NUM_THREADS=N "
            "chooses instead"
        ]
    finally:
        torch.set_num_threads(threads)
