"""A ladder's runs: one sweep per rung, the points of its finished runs (compute = the declared
FLOPs per token × the tokens trained), a re-run that trains nothing twice, an interrupted run
resumed, and directories that are not this ladder's refused."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lmcore.ladder.runs import (
    LADDER_FILE,
    LadderResult,
    collect_points,
    read_ladder,
    run_ladder,
    rung_dir,
)
from lmcore.ladder.sizing import LadderError, LadderPlan, size_ladder
from lmcore.train.config import TrainConfig
from lmcore.train.runs import read_run
from tests.helpers.models import TINY_SPEC

CONFIG = TrainConfig(batch_size=4, eval_batches=1, eval_every=0, save_every=0, device="cpu")


def tiny_plan() -> LadderPlan:
    # 3 rungs of the tiny model, N × 1.5 a rung, 0.02 tokens per parameter: 7 to 15 steps
    return size_ladder(TINY_SPEC, ["pos=nope"], rungs=3, factor=1.5, tokens_per_param=0.02,
                       batch_size=CONFIG.batch_size, config=CONFIG)  # fmt: skip


@dataclass(frozen=True)
class Trained:
    plan: LadderPlan
    out: Path
    result: LadderResult
    lines: list[str]


@pytest.fixture(scope="module")
def trained(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trained]:
    """One ladder trained once for the module: 3 rungs × 2 models × 2 seeds."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan, out, lines = tiny_plan(), tmp_path_factory.mktemp("ladder") / "l", []
        result = run_ladder(plan, tiny_data, out, CONFIG, seeds=2, echo=lines.append)
        yield Trained(plan, out, result, lines)
    finally:
        torch.set_num_threads(threads)


def test_a_ladder_trains_every_model_of_every_rung_and_gives_its_points(trained: Trained) -> None:
    plan, out, result = trained.plan, trained.out, trained.result
    assert result.interrupted is None and result.missing == [] and result.failed == []
    assert len(result.points) == 3 * 2 * 2  # rungs × models × seeds
    info = json.loads((out / LADDER_FILE).read_text())
    assert info["format"] == "lmcore-ladder" and info["rungs"] == 3 and info["seeds"] == 2
    for p in result.points:
        rung = plan.rungs[p.rung]
        model = next(m for m in rung.models if m.label == p.variant)
        run = rung_dir(out, p.rung) / f"{model.name}-seed{p.seed}"
        status = read_run(run)["status"]
        assert read_run(run)["spec"] == str(model.blueprint.spec)  # the model the plan sized
        assert status["step"] == rung.steps and p.tokens == status["tokens"] == rung.tokens
        assert p.params == model.params
        assert p.flops == model.flops_per_token * rung.tokens
        assert p.loss == status["val_loss"]
    assert sorted({p.seed for p in result.points}) == [0, 1]
    assert sum(line.startswith("rung ") for line in trained.lines) == 3
    for k in range(3):  # each rung is an ordinary sweep
        assert (rung_dir(out, k) / "sweep.json").is_file()
        assert (rung_dir(out, k) / "compare.md").is_file()


def test_a_rerun_trains_nothing_twice(trained: Trained, tiny_data: Path) -> None:
    lines: list[str] = []
    again = run_ladder(trained.plan, tiny_data, trained.out, CONFIG, seeds=2, echo=lines.append)
    assert sum("done before, kept" in line for line in lines) == 12
    assert again.points == trained.result.points


def test_an_interrupted_run_resumes_and_a_missing_one_is_trained(
    trained: Trained, tiny_data: Path, tmp_path: Path
) -> None:
    plan, out = trained.plan, tmp_path / "copy"
    shutil.copytree(trained.out, out)
    top = plan.rungs[2]
    shutil.rmtree(rung_dir(out, 2) / f"{top.models[1].name}-seed1")
    cut = rung_dir(out, 2) / f"{top.baseline.name}-seed1"
    info = json.loads((cut / "run.json").read_text())
    info["status"]["state"] = "interrupted"  # as a run stopped by Ctrl-C records itself
    (cut / "run.json").write_text(json.dumps(info))
    points, missing = collect_points(out, read_ladder(out))
    assert len(points) == 10 and sorted(missing) == [
        "rung 2, baseline, seed 1: interrupted",
        "rung 2, pos=nope, seed 1: not run",
    ]
    lines: list[str] = []
    again = run_ladder(plan, tiny_data, out, CONFIG, seeds=2, echo=lines.append)
    assert len(again.points) == 12 and again.missing == []
    assert sum("done before, kept" in line for line in lines) == 10
    resumed = [p for p in again.points if (p.rung, p.variant, p.seed) == (2, "baseline", 1)]
    assert resumed[0].tokens == top.tokens


def test_a_directory_that_is_not_this_ladder_is_refused(
    trained: Trained, tiny_data: Path, tmp_path: Path
) -> None:
    plan, out = trained.plan, trained.out
    with pytest.raises(LadderError, match=r"holds another ladder \(its seeds differ\)"):
        run_ladder(plan, tiny_data, out, CONFIG, seeds=3, echo=None)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(LadderError, match=r"is not an empty directory and holds no ladder"):
        run_ladder(plan, tiny_data, other, CONFIG, echo=None)
    with pytest.raises(LadderError, match=r"not a ladder's directory, no ladder.json there"):
        read_ladder(other)
    (other / LADDER_FILE).write_text("{not json")
    with pytest.raises(LadderError, match=r"ladder.json: cannot be read as JSON"):
        read_ladder(other)
    (other / LADDER_FILE).write_text('{"format": "lmcore-sweep"}')
    with pytest.raises(LadderError, match=r"not a ladder's description"):
        read_ladder(other)
