"""A mixture-of-experts model trains with DDP and FSDP2 on 2 CPU processes (torchrun, gloo):
without the load-balancing loss two ranks reproduce one process; with it, each rank adds the
loss of its own tokens and logs their mean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lmcore.train.runs import read_metrics
from lmcore.train.trainer import train
from tests.helpers.runs import latest_weights, torchrun
from tests.train.parallel_moe_worker import AUX, CONFIG, SPEC

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    pytest.mark.slow,
]  # 2-process runs: ~15-20 s

WORKER = Path(__file__).with_name("parallel_moe_worker.py")


@pytest.fixture(scope="module")
def runs(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The 2-rank runs (the worker's), beside the same runs in this one process."""
    out = tmp_path_factory.mktemp("moe-runs")
    done = torchrun(WORKER, tiny_data, out, cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(SPEC, tiny_data, out / "one", CONFIG, echo=None)
        train(AUX, tiny_data, out / "one-aux", CONFIG, echo=None)
    finally:
        torch.set_num_threads(threads)
    yield out


def train_records(run: Path) -> list[dict[str, float]]:
    return [r for r in read_metrics(run) if r["kind"] == "train"]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_train_the_mixture_as_one_process(runs: Path, mode: str) -> None:
    got, want = train_records(runs / mode), train_records(runs / "one")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(got, want, strict=True)) <= 1e-5
    wa, wb = latest_weights(runs / mode), latest_weights(runs / "one")
    assert wa.keys() == wb.keys() and "layers.1.ffn.experts.3.w2.weight" in wa
    for name in wb:
        assert (wa[name] - wb[name]).abs().max().item() <= 1e-5, name


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_with_the_aux_loss_each_rank_balances_its_tokens(runs: Path, mode: str) -> None:
    got, want = train_records(runs / f"{mode}-aux"), train_records(runs / "one-aux")
    assert all("aux_loss" in r for r in (*got, *want))
    # the first step's loss is the same (same weights and batch); the ranks' aux losses are of
    # their own half batches, so the runs part slightly from there on
    assert abs(got[0]["loss"] - want[0]["loss"]) <= 1e-5
    for a, b in zip(got, want, strict=True):
        assert abs(a["aux_loss"] - b["aux_loss"]) < 0.05 * b["aux_loss"]
        assert abs(a["loss"] - b["loss"]) < 1e-2
