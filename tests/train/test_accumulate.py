"""Gradient accumulation: micro-batches give the whole batch's update, in one process and (the
slow tests) under DDP and FSDP2 on 2 CPU processes, synchronising once a step."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from lmcore.data import TokenData
from lmcore.errors import TrainError
from lmcore.model.nn import IGNORE, cross_entropy
from lmcore.model.transformer import TransformerLM
from lmcore.train.accumulate import micro_batches, micro_steps, micro_weights, weighted
from lmcore.train.config import TrainConfig
from lmcore.train.runs import read_metrics, read_run
from lmcore.train.trainer import resume, train
from tests.helpers.errors import raises_naming
from tests.helpers.runs import latest_weights, torchrun
from tests.train.accumulate_worker import CONFIG, SPEC

pytestmark = pytest.mark.usefixtures("single_thread")

WORKER = Path(__file__).with_name("accumulate_worker.py")
TOL = 1e-5


def records(run: Path, kind: str = "train") -> list[dict[str, float]]:
    return [r for r in read_metrics(run) if r["kind"] == kind]


def assert_same_run(got: Path, want: Path, tol: float = TOL) -> None:
    a, b = records(got), records(want)
    assert [r["step"] for r in a] == [r["step"] for r in b] and a
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b, strict=True)) <= tol
    assert max(abs(x["grad_norm"] - y["grad_norm"]) for x, y in zip(a, b, strict=True)) <= tol
    wa, wb = latest_weights(got), latest_weights(want)
    assert wa.keys() == wb.keys()
    for name in wb:
        assert (wa[name] - wb[name]).abs().max().item() <= tol, name


# ------------------------------------------------------------------------------ the pieces


def test_micro_steps_divide_the_batch_and_split_over_the_processes() -> None:
    assert micro_steps(32, None) == 1
    assert micro_steps(32, 8) == 4
    assert micro_steps(32, 8, world_size=2) == 4
    with raises_naming(TrainError, "--micro-batch 3", "divisor of --batch-size 8"):
        micro_steps(8, 3)
    with raises_naming(TrainError, "--micro-batch 3", "2 processes", "multiple of 2"):
        micro_steps(6, 3, world_size=2)


def test_micro_batches_are_the_rows_in_order() -> None:
    x = torch.arange(24).reshape(6, 4)
    parts = list(micro_batches(x, x + 100, 3))
    assert len(parts) == 3
    assert torch.equal(torch.cat([p for p, _, _ in parts]), x)
    assert torch.equal(torch.cat([q for _, q, _ in parts]), x + 100)
    assert all(p.shape == (2, 4) and d is None for p, _, d in parts)
    with_documents = list(micro_batches(x, x + 100, 3, x + 200))  # document ids, sliced alike
    assert torch.equal(torch.cat([d for _, _, d in with_documents]), x + 200)
    with raises_naming(TrainError, "6 rows", "4 micro-batches"):
        list(micro_batches(x, x, 4))
    loss = torch.tensor(3.0)
    assert micro_weights(x, 1) is None and weighted([loss], None) is loss
    assert micro_weights(x, 3).tolist() == pytest.approx([1 / 3] * 3)  # nothing ignored
    y = x.clone()
    y[:2, :3] = IGNORE  # 2 of the first micro-batch's 8 targets kept, all 8 of the others
    assert micro_weights(y, 3).tolist() == pytest.approx([2 / 18, 8 / 18, 8 / 18])
    assert weighted([loss, torch.tensor(1.0)], torch.tensor([0.25, 0.75])).item() == 1.5
    assert micro_weights(torch.full((2, 2), IGNORE), 2).tolist() == [0.0, 0.0]  # no NaN


def test_the_option_names_both_numbers() -> None:
    with raises_naming(TrainError, "--micro-batch 3", "a divisor of --batch-size 8"):
        TrainConfig(batch_size=8, micro_batch=3).check()
    with raises_naming(TrainError, "--micro-batch 0"):
        TrainConfig(micro_batch=0).check()
    assert TrainConfig(batch_size=8, micro_batch=2).cli_args() == [
        "--batch-size", "8", "--micro-batch", "2"]  # fmt: skip


def test_micro_batches_of_the_mean_loss_give_the_batch_gradient() -> None:
    """The identity the runner relies on, against autograd on the whole batch, with a loss mask
    that keeps more targets in some micro-batches than in others."""
    torch.manual_seed(0)
    model = TransformerLM(SPEC)
    x = torch.randint(0, 300, (8, 16))
    y = torch.roll(x, -1, dims=1)
    y[:3, :5] = IGNORE  # a loss mask keeping fewer targets in the first micro-batch
    cross_entropy(model(x), y).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    w = micro_weights(y, 4)
    for i, (xm, ym, _) in enumerate(micro_batches(x, y, 4)):
        (cross_entropy(model(xm), ym) * w[i]).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, want[name], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ one process


@pytest.fixture(scope="module")
def full(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole-batch run the others are compared with."""
    out = tmp_path_factory.mktemp("full") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(SPEC, tiny_data, out, CONFIG, echo=None)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("micro", [4, 2, 1])
def test_micro_batched_steps_equal_the_whole_batch(
    full: Path, tiny_data: Path, tmp_path: Path, micro: int
) -> None:
    config = dataclasses.replace(CONFIG, micro_batch=micro)
    run = train(SPEC, tiny_data, tmp_path / "micro", config, echo=None).run
    assert read_run(run)["config"]["micro_batch"] == micro
    assert_same_run(run, full)
    # the logged loss is the whole batch's mean, as the validation loss is
    assert [r["step"] for r in records(run, "eval")] == [r["step"] for r in records(full, "eval")]


@pytest.mark.parametrize("recompute", ["layers", "mixer,ffn"])
def test_recomputed_micro_batched_steps_equal_the_whole_batch(
    full: Path, tiny_data: Path, tmp_path: Path, recompute: str
) -> None:
    config = dataclasses.replace(CONFIG, micro_batch=4, recompute=recompute)
    run = train(SPEC, tiny_data, tmp_path / "re", config, echo=None).run
    assert read_run(run)["config"]["recompute"] == recompute
    assert_same_run(run, full)


def test_a_run_resumes_with_another_micro_batch(
    full: Path, tiny_data: Path, tmp_path: Path
) -> None:
    run = train(SPEC, tiny_data, tmp_path / "r", CONFIG, echo=None, stop_after=2).run
    done = resume(run, echo=None, micro_batch=2)
    assert done.ok and read_run(run)["config"]["micro_batch"] == 2
    assert_same_run(run, full)


def test_a_mixture_of_experts_logs_the_mean_of_its_micro_batches_aux_losses(
    tiny_data: Path, tmp_path: Path
) -> None:
    spec = f"{SPEC}, ffn=moe(num_experts=4, top_k=2, aux_loss_coef=0.5)"
    config = TrainConfig(steps=1, batch_size=8, micro_batch=2, eval_batches=1, eval_every=0,
                         log_every=1, save_every=0, device="cpu", lr=3e-3, warmup=1)  # fmt: skip
    run = train(spec, tiny_data, tmp_path / "moe", config, echo=None).run
    (record,) = records(run)
    # The same initial weights and first batch, by hand: each micro-batch's forward.
    torch.manual_seed(config.seed)
    model = TransformerLM(spec)
    x, y = TokenData.open(tiny_data).sampler(
        "train", batch_size=8, context_length=16, seed=config.seed).batch(0)  # fmt: skip
    auxes, losses = [], []
    for xm, ym, _ in micro_batches(x, y, 4):
        losses.append(cross_entropy(model(xm), ym).item())
        aux = model.aux_loss()
        assert aux is not None
        auxes.append(aux.item())
    assert record["aux_loss"] == pytest.approx(sum(auxes) / 4, rel=1e-5)
    assert record["loss"] == pytest.approx(sum(losses) / 4, rel=1e-5)


# ------------------------------------------------------------------------------ 2 processes


@pytest.fixture(scope="module")
def two_ranks(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("accumulate-two-ranks")
    done = torchrun(WORKER, tiny_data, out, cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]
    yield out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_accumulating_equal_one_process_on_the_whole_batch(
    two_ranks: Path, full: Path, mode: str
) -> None:
    assert_same_run(two_ranks / f"{mode}-micro", full)
    assert_same_run(two_ranks / f"{mode}-full", full)
    # recomputation inside, the DDP wrapper or FSDP2's shards outside
    assert_same_run(two_ranks / f"{mode}-recompute", full)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_ranks_synchronise_gradients_once_a_step(two_ranks: Path, mode: str) -> None:
    """As many gradient reductions (DDP's all-reduce buckets, FSDP2's reduce-scatters) with 4
    micro-batches a step as with the whole batch: one backward's worth a step."""
    counts = json.loads((two_ranks / "reductions.json").read_text())
    full, micro = counts[f"{mode}-full"], counts[f"{mode}-micro"]
    assert full > 0 and micro == full, counts
    assert counts[f"{mode}-synced-every-micro-batch"] == 4 * full, counts
