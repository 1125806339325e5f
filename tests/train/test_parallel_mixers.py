"""A model whose layers hold every built-in mixer trains with DDP and FSDP2 on 2 CPU processes
(torchrun, gloo) as one process does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lmcore.train.runs import read_metrics
from lmcore.train.trainer import train
from tests.helpers.runs import latest_weights, torchrun
from tests.train.parallel_mixers_worker import CONFIG, SPEC

pytestmark = [pytest.mark.usefixtures("single_thread"), pytest.mark.slow]  # ~15-20 s

WORKER = Path(__file__).with_name("parallel_mixers_worker.py")


@pytest.fixture(scope="module")
def runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("mixer-runs")
    done = torchrun(WORKER, tiny_data, out, cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(SPEC, tiny_data, out / "one", CONFIG, echo=None)
    finally:
        torch.set_num_threads(threads)
    yield out


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_train_every_mixer_as_one_process(runs: Path, mode: str) -> None:
    def records(run: Path) -> list[dict[str, float]]:
        return [r for r in read_metrics(run) if r["kind"] == "train"]

    got, want = records(runs / mode), records(runs / "one")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want, strict=True)) <= 1e-5
    wa, wb = latest_weights(runs / mode), latest_weights(runs / "one")
    assert wa.keys() == wb.keys() and {
        "layers.0.attn.conv_weight", "layers.2.attn.A_log", "layers.3.attn.kv_b_proj.weight",
        "layers.4.attn.A_log", "layers.5.attn.attn.q_proj.weight", "layers.5.attn.ssm.A_log",
    } <= wa.keys()
    for name in wb:
        assert (wa[name] - wb[name]).abs().max().item() <= 1e-5, name
