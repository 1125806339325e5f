"""The training runner: learning, exact resumption, faults, divergence, the run directory."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

import lmcore
from lmcore.data import TokenData
from lmcore.errors import CheckpointError, DataError, TrainError
from lmcore.model import saving
from lmcore.train.config import TrainConfig
from lmcore.train.runs import (
    CHECKPOINTS,
    PLOT_FILE,
    RUN_FILE,
    checkpoints,
    find_model,
    latest_checkpoint,
    read_metrics,
    read_run,
    spec_hash,
    spec_tag,
)
from lmcore.train.trainer import resume, train
from tests.helpers.errors import raises_naming
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import PNG, latest_weights

pytestmark = pytest.mark.usefixtures("single_thread")


FAST = {"batch_size": 8, "eval_batches": 2, "eval_every": 10, "log_every": 1, "device": "cpu"}


def config(**kw: object) -> TrainConfig:
    return TrainConfig(**{**FAST, **kw})  # type: ignore[arg-type]


def test_loss_falls_on_a_learnable_corpus(tiny_data: Path, tmp_path: Path) -> None:
    result = train(TINY_SPEC, tiny_data, tmp_path / "run", config(steps=200, lr=3e-3, eval_every=50),
                   echo=None)  # fmt: skip
    assert result.status == "done" and result.step == 200
    evals = [r["val_loss"] for r in result.records if r["kind"] == "eval"]
    assert evals[0] == pytest.approx(math.log(300), abs=0.3)  # a fresh model guesses uniformly
    assert evals[-1] < 2.0 < evals[0] - 3  # it learnt the corpus's structure
    assert evals == sorted(evals, reverse=True)  # and validation fell at every evaluation
    assert result.val_loss == evals[-1] and result.first_val_loss == evals[0]


def test_bf16_autocast_trains_float32_parameters(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = train(TINY_SPEC, tiny_data, run, config(steps=30, lr=3e-3, autocast="bfloat16"),
                   echo=None)  # fmt: skip
    assert result.status == "done" and result.val_loss is not None
    assert result.first_val_loss is not None and result.val_loss < result.first_val_loss - 0.5
    assert read_run(run)["config"]["autocast"] == "bfloat16"
    weights = latest_weights(run)
    assert {t.dtype for t in weights.values()} == {torch.float32}  # autocast casts, not stores


def test_a_run_directory_holds_what_the_readme_says(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = train(TINY_SPEC, tiny_data, run, config(steps=20, save_every=10, keep=0), echo=None)
    info = read_run(run)
    spec = lmcore.parse_spec(TINY_SPEC)
    assert info["spec"] == str(spec) and info["tag"] == spec_tag(spec) == result.tag
    assert info["tag"].endswith(spec_hash(spec)) and info["tag"].startswith("L2-d32-rmsnorm")
    assert info["status"]["state"] == "done" and info["status"]["step"] == 20
    assert info["config"]["warmup"] == 2 and info["config"]["min_lr"] == pytest.approx(1e-4)
    assert info["data"]["path"] == str(tiny_data.resolve()) and info["parameters"] > 0
    assert [c.step for c in checkpoints(run)] == [10, 20]
    assert (run / PLOT_FILE).read_bytes()[:8] == PNG
    records = read_metrics(run)
    kinds = [r["kind"] for r in records]
    assert kinds.count("train") == 20 and kinds.count("eval") == 3  # steps 0, 10, 20
    train_keys = {"step", "tokens", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"}
    assert train_keys <= set(records[2]) and records[2]["tokens"] == 8 * 16
    assert [r["event"] for r in records if r["kind"] == "event"] == ["start", "done"]
    # the model file is an ordinary checkpoint that names its tokenizer
    model_file, tokenizer = find_model(run)
    assert model_file == latest_checkpoint(run).model  # type: ignore[union-attr]
    assert tokenizer is not None
    assert tokenizer.read_bytes() == (tiny_data / "tokenizer.json").read_bytes()
    assert find_model(model_file) == (model_file, tokenizer)
    assert find_model(model_file.parent) == (model_file, tokenizer)
    meta = lmcore.read_info(model_file).metadata
    assert meta["train.step"] == "20" and meta["train.tag"] == result.tag
    assert lmcore.load(model_file).spec == spec
    own = lmcore.read_info(model_file).tokenizer  # and carries it, so it stands alone
    assert own is not None and own.json == Tokenizer.from_file(str(tokenizer)).to_str()


def test_resume_continues_bit_for_bit(tiny_data: Path, tmp_path: Path) -> None:
    """2×N steps in one go equal N steps, a stop, and N more after resuming."""
    n = 15
    cfg = config(steps=2 * n, eval_every=5, lr=3e-3)
    whole = train(TINY_SPEC, tiny_data, tmp_path / "whole", cfg, echo=None)
    first = train(TINY_SPEC, tiny_data, tmp_path / "split", cfg, echo=None, stop_after=n)
    assert first.status == "interrupted" and first.step == n and first.reason == "stop_after"
    assert latest_checkpoint(tmp_path / "split").step == n  # type: ignore[union-attr]
    second = resume(tmp_path / "split", echo=None)
    assert second.status == "done" and second.step == 2 * n

    a = latest_checkpoint(tmp_path / "whole")
    b = latest_checkpoint(tmp_path / "split")
    assert a is not None and b is not None and a.step == b.step == 2 * n
    for name in ("model.safetensors", "trainer.safetensors"):
        ta, tb = load_file(str(a.path / name)), load_file(str(b.path / name))
        assert ta.keys() == tb.keys()
        for key in ta:
            if not key.startswith("rng."):
                assert torch.equal(ta[key], tb[key]), key

    def losses(run: str) -> list[tuple[str, int, float]]:
        return [(r["kind"], r["step"], r.get("loss", r.get("val_loss")))
                for r in read_metrics(tmp_path / run) if r["kind"] in ("train", "eval")]  # fmt: skip

    assert losses("whole") == losses("split")  # every step's loss, every evaluation, exactly
    assert len(losses("split")) == 2 * n + 7
    assert second.val_loss == whole.val_loss and second.first_val_loss == whole.first_val_loss
    events = [r["event"] for r in read_metrics(tmp_path / "split") if r["kind"] == "event"]
    assert events == ["start", "interrupted", "resume", "done"]


def test_a_failed_save_leaves_the_previous_checkpoint(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    calls = {"n": 0}
    real = saving.save_file  # every safetensors file of a checkpoint is written through it

    def failing(tensors: dict[str, torch.Tensor], path: str, **kw: object) -> None:
        calls["n"] += 1
        if calls["n"] == 4:  # the second checkpoint: its model file is written, then this fails
            real(tensors, path, **kw)
            with open(path, "r+b") as f:
                f.truncate(100)
            raise OSError(28, "No space left on device")
        real(tensors, path, **kw)

    monkeypatch.setattr(saving, "save_file", failing)
    with pytest.raises(TrainError, match=r"cannot save checkpoint .*step-000010: No space left"):
        train(TINY_SPEC, tiny_data, run, config(steps=20, save_every=5), echo=None)
    assert [c.step for c in checkpoints(run)] == [5]
    assert sorted(p.name for p in (run / CHECKPOINTS).iterdir()) == ["step-000005"]  # no debris
    assert lmcore.load(latest_checkpoint(run).model).spec == lmcore.parse_spec(TINY_SPEC)  # type: ignore[union-attr]
    monkeypatch.setattr(saving, "save_file", real)
    result = resume(run, echo=None)  # and the run goes on from it
    assert result.status == "done" and result.step == 20
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == list(range(1, 21))


def test_divergence_is_recorded_and_ends_the_run(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmcore.train import losses

    calls = {"n": 0}
    real = losses.cross_entropy_and_log_z

    def nan_at_step_7(
        logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        calls["n"] += 1  # the training steps' loss (evaluation's is trainer.cross_entropy)
        loss, log_z = real(logits, targets)
        return (loss * math.nan if calls["n"] == 7 else loss), log_z

    monkeypatch.setattr(losses, "cross_entropy_and_log_z", nan_at_step_7)
    lines: list[str] = []
    run = tmp_path / "run"
    result = train(TINY_SPEC, tiny_data, run, config(steps=30, log_every=5, save_every=5),
                   echo=lines.append)  # fmt: skip
    assert result.status == "diverged" and result.diverged_at == 7 and result.step == 7
    assert lines[-3].startswith("diverged at step 7: the loss is not finite")
    status = read_run(run)["status"]
    assert status["state"] == "diverged" and status["diverged_at"] == 7
    events = [r for r in read_metrics(run) if r["kind"] == "event"]
    assert events[-2]["event"] == "diverged" and events[-2]["step"] == 7
    assert math.isnan(events[-2]["loss"])
    assert [c.step for c in checkpoints(run)] == [5]  # nothing saved after it
    with pytest.raises(TrainError, match=r"diverged at step 7; resuming would repeat the same"):
        resume(run, echo=None)


def test_training_from_a_checkpoint_starts_from_its_weights(
    tiny_data: Path, tmp_path: Path
) -> None:
    first = train(TINY_SPEC, tiny_data, tmp_path / "a", config(steps=30, lr=3e-3), echo=None)
    assert first.checkpoint is not None
    info = lmcore.read_info(first.checkpoint.model)
    again = train(info, tiny_data, tmp_path / "b", config(steps=5, eval_every=0), echo=None)
    assert read_run(tmp_path / "b")["init"] == str(first.checkpoint.model.resolve())
    assert again.first_val_loss == pytest.approx(first.val_loss, rel=1e-6)


def test_a_run_directory_is_never_overwritten(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(TINY_SPEC, tiny_data, run, config(steps=2), echo=None)
    with raises_naming(TrainError, f"--out {run} already holds a run",
                       re.compile(r"\(L2-d32-.*, done at step 2\)"),
                       f"lmcore train --resume {run}"):  # fmt: skip
        train(TINY_SPEC, tiny_data, run, config(steps=2), echo=None)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(TrainError, match=r"is not an empty directory and holds no run"):
        train(TINY_SPEC, tiny_data, tmp_path / "other", config(steps=2), echo=None)
    with pytest.raises(TrainError, match=r"is not a run directory: it has no run.json"):
        resume(tmp_path / "other", echo=None)


def test_data_that_does_not_fit_the_model(tiny_data: Path, tmp_path: Path) -> None:
    with raises_naming(DataError, "vocab_size=256", "smaller than the data's 277"):
        train("cs336-tiny, vocab_size=256", tiny_data, tmp_path / "r", config(steps=2), echo=None)
    assert not (tmp_path / "r").exists()  # nothing was written


def test_resume_refuses_changes_that_alter_the_run(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(TINY_SPEC, tiny_data, run, config(steps=4), echo=None, stop_after=2)
    with raises_naming(TrainError, "--lr 0.1", "(the run has 0.001)", "cannot change when resuming",
                       re.compile(r"a resumed run takes: --steps, --tokens, .*--device")):  # fmt: skip
        resume(run, lr=0.1, echo=None)
    with pytest.raises(TrainError, match=r"--steps 1 is below the 2 steps .* has done"):
        resume(run, steps=1, echo=None)
    info = json.loads((run / RUN_FILE).read_text())
    info["data"]["train_tokens"] += 1
    (run / RUN_FILE).write_text(json.dumps(info))
    with raises_naming(TrainError, "was trained on", "train_tokens 3253 then, 3252 now"):
        resume(run, echo=None)
    info["data"]["train_tokens"] -= 1
    info["recipe"]["schedule"]["version"] = "0.0.1"  # as if another version had trained it
    (run / RUN_FILE).write_text(json.dumps(info))
    with raises_naming(TrainError, "trained with schedule 'cosine' from lmcore-registry 0.0.1",
                       f"but lmcore-registry {lmcore.__version__} provides it now",
                       "install lmcore-registry==0.0.1, or start a new run"):  # fmt: skip
        resume(run, echo=None)


def test_a_finished_run_trains_on_at_the_floor(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(TINY_SPEC, tiny_data, run, config(steps=10), echo=None)
    with raises_naming(TrainError, "has done all its 10 steps",
                       re.compile(r"lmcore train --resume .* --steps N")):  # fmt: skip
        resume(run, echo=None)
    more = resume(run, steps=14, echo=None)
    assert more.status == "done" and more.step == 14
    lrs = [r["lr"] for r in read_metrics(run) if r["kind"] == "train"]
    assert lrs[-4:] == [pytest.approx(1e-4)] * 4  # past decay_steps the schedule stays at min_lr


def test_the_data_position_is_the_step(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(TINY_SPEC, tiny_data, run, config(steps=6, seed=3), echo=None, stop_after=4)
    state = json.loads((latest_checkpoint(run).path / "trainer.json").read_text())  # type: ignore[union-attr]
    assert state["step"] == 4 and state["data"] == {"seed": 3, "next_batch": 4}
    assert state["optimizer"]["param_names"][1][0] == "layers.0.ln1.weight"
    sampler = TokenData.open(tiny_data).sampler("train", batch_size=8, context_length=16, seed=3)
    assert torch.equal(sampler.batch(4)[0], sampler.batch(4)[0])
    assert os.path.isfile(latest_checkpoint(run).tokenizer)  # type: ignore[union-attr]


def test_a_progress_bar_on_request(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(TINY_SPEC, tiny_data, tmp_path / "run", config(steps=12, log_every=4), echo=None,
          progress=True)  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out == ""  # echo=None: no report
    assert "12/12" in captured.err and re.search(r"loss \d\.\d{4}, [\d,]+ tok/s", captured.err)


def test_a_trainer_state_of_another_version_is_refused_by_name(
    tiny_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    train(TINY_SPEC, tiny_data, run, config(steps=6), echo=None, stop_after=4)
    file = latest_checkpoint(run).path / "trainer.json"  # type: ignore[union-attr]
    state = json.loads(file.read_text())
    file.write_text(json.dumps({**state, "version": 7}))
    with raises_naming(CheckpointError, str(file), "lmcore-trainer-state version 7",
                       "reads version 1"):  # fmt: skip
        resume(run, echo=None)


def test_context_trains_on_shorter_windows_than_the_models(tiny_data: Path, tmp_path: Path) -> None:
    from lmcore.train.runs import read_run

    lines: list[str] = []
    result = train(TINY_SPEC, tiny_data, tmp_path / "run", config(steps=2, context=8),
                   echo=lines.append)  # fmt: skip
    assert result.status == "done"
    assert any("× batch 8 × 8 tokens = 128 tokens" in line for line in lines), lines
    assert read_run(tmp_path / "run")["config"]["context"] == 8
    assert result.tokens == 2 * 8 * 8
    with raises_naming(TrainError, "--context 17: longer than the model's context_length 16",
                       "at most 16"):  # fmt: skip
        train(TINY_SPEC, tiny_data, tmp_path / "long", config(steps=1, context=17), echo=None)
