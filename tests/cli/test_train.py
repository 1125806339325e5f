"""`lmcore train` on the command line: the report, Ctrl-C, resuming, a full disk, today's
options, and its errors, one line naming the fix."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.cli.main import main
from lmcore.model.generate import GREEDY
from lmcore.train.runs import checkpoints, latest_checkpoint, read_metrics, read_run
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import disk_full_after, one_line_error

pytestmark = pytest.mark.usefixtures("single_thread")


FAST = ["--batch-size", "8", "--eval-batches", "2", "--device", "cpu"]


def test_train_reports_the_run_and_the_falling_loss(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    argv = ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps", "40",
            "--eval-every", "20", "--lr", "3e-3", *FAST]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    tag = read_run(run)["tag"]
    assert lines[0] == f"run: {run}  (tag {tag})"
    assert lines[1] == f"spec: {lmcore.parse_spec(TINY_SPEC)}"
    assert re.fullmatch(r"model: [\d,]+ parameters, float32 on cpu", lines[2])
    assert lines[3] == (
        f"data: {tiny_data}: train 3,252 tokens, val 804, vocabulary 277; the model's "
        "vocab_size 300 leaves 23 ids unused"
    )
    assert lines[4] == "budget: 40 steps × batch 8 × 16 tokens = 5,120 tokens (1.57 epochs), seed 0"
    assert lines[5] == (
        "optimizer: adamw, betas 0.9 0.95, weight decay 0.1 on matrix, packed, head, router, "
        "conv, clip 1"
    )
    assert lines[6] == "schedule: cosine, lr 0.003 → 0.0003, warmup 4, decay_steps 40"

    vals = [float(m[1]) for m in re.finditer(r"^step +\d+  val (\d+\.\d+)", captured.out, re.M)]
    assert len(vals) == 3 and vals[0] > vals[1] > vals[2]
    assert re.fullmatch(r"step 20  val \d\.\d{4}  ppl [\d,.]+  train \d\.\d{4}  [\d,]+ tok/s  "
                        r"\d+\.\d s", lines[8])  # fmt: skip
    assert re.fullmatch(
        rf"done: 40 steps, 5,120 tokens in \d+\.\d s \([\d,]+ tokens/s while training\); val "
        rf"loss {vals[0]:.4f} → {vals[2]:.4f}",
        lines[10],
    )
    ckpt = run / "checkpoints" / "step-000040"
    assert lines[11] == f"checkpoint: {ckpt} (model: {ckpt / 'model.safetensors'})"
    assert lines[12] == f"metrics: {run / 'metrics.jsonl'}, loss curve: {run / 'loss.png'}"
    assert len(lines) == 13
    assert captured.err == ""  # no progress bar when stderr is not a terminal
    # the checkpoint works wherever a checkpoint is taken
    assert main(["describe", str(ckpt / "model.safetensors")]) == 0
    assert "metadata: train.step = 40" in capsys.readouterr().out


def test_resume_on_the_command_line(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    base = ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps", "10", *FAST]
    assert main(base) == 0
    assert main(["train", "--resume", str(run), "--steps", "14", "--eval-every", "2"]) == 0
    out = capsys.readouterr().out
    assert f"resumed: from {run / 'checkpoints' / 'step-000010'} at step 10" in out
    assert read_run(run)["status"]["step"] == 14
    # no train record yet in this session: the line shows no throughput rather than 0 tok/s
    assert re.search(
        r"^step 12  val \d\.\d{4}  ppl [\d,.]+  train \d\.\d{4}  \d+\.\d s$", out, re.M
    )


def run_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "lmcore", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_training(run: Path, child: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["kind"] == "train" for r in read_metrics(run)):
            return
        assert child.poll() is None, child.communicate()
        time.sleep(0.1)
    child.kill()
    raise AssertionError("training did not start")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_a_checkpoint_and_resume_goes_on(
    tiny_data: Path, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    run = tmp_path / "run"
    child = run_cli("train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run),
                    "--steps", "100000", "--save-every", "0", "--eval-every", "0", "--log-every",
                    "1", *FAST, cwd=tmp_path)  # fmt: skip
    wait_for_training(run, child)
    child.send_signal(sig)
    out, err = child.communicate(timeout=120)
    assert child.returncode == code, err
    step = read_run(run)["status"]["step"]
    assert read_run(run)["status"]["state"] == "interrupted" and step >= 1
    assert [c.step for c in checkpoints(run)] == [step]
    assert f"{sig.name}: stopping after this step with a checkpoint" in out
    assert (
        f"interrupted ({sig.name}) at step {step:,} of 100,000; continue with: lmcore train " in out
    )
    assert err == ""
    assert main(["train", "--resume", str(run), "--steps", str(step + 3)]) == 0
    assert latest_checkpoint(run).step == step + 3  # type: ignore[union-attr]
    steps = [r["step"] for r in read_metrics(run) if r["kind"] == "train"]
    assert steps == list(range(1, step + 4))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train"], "give a SPEC (or checkpoint) to train, e.g. lmcore train cs336-tiny --data DIR"),
        (["train", "cs336-tiny", "--out", "r"], "--data DIR is needed to train 'cs336-tiny': --data "
         "names prepared data (lmcore data prepare), --out the new run directory"),
        (["train", "cs336-tiny", "--data", "nowhere", "--out", "r"], "data directory 'nowhere' "
         "does not exist; run: lmcore data prepare SOURCE... --out nowhere"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--lr", "-1"],
         "--lr -1.0: must be a number > 0, e.g. 1e-3"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--betas", "0.9", "1"],
         "--betas 0.9 1.0: must be two numbers in [0, 1), e.g. 0.9 0.95"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--seed", "18446744073709551616"],
         "argument --seed: expected an integer in 0 .. 2**64-1, got '18446744073709551616'"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--warmup", "-3"],
         "--warmup -3: must be an integer ≥ 0"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--z-loss", "-0.5"],
         "--z-loss -0.5: must be a number ≥ 0 (0: off), e.g. 1e-4"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--z-loss", "nan"],
         "--z-loss nan: must be a number ≥ 0 (0: off), e.g. 1e-4"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--z-loss", "much"],
         "argument --z-loss: invalid float value: 'much'"),
        (["train", "cs336-tiny, vocab_size=256", "--data", "DATA", "--out", "r"], "the model's "
         "vocab_size=256 is smaller than the data's 277 tokens"),
        (["train", "--resume", "r", "--out", "x"], "--resume r continues that run in its own "
         "directory: give neither SPEC nor --out with it"),
        (["train", "--resume", "DATA"], "is not a run directory: it has no run.json"),
        (["train", "nope.safetensors", "--data", "DATA", "--out", "r"], "nope.safetensors: no such file"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--adapter", "lora(rank=8)"],
         "--adapter lora(rank=8): fine-tunes a checkpoint (lmcore train CKPT --adapter ...); a "
         "spec takes the adapter as its key adapter= instead: lmcore train "
         "'SPEC, adapter=lora(rank=8)'"),
        (["train", "cs336-tiny", "--data", "DATA", "--out", "r", "--context", "100000"],
         "--context 100000: longer than the model's context_length"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [str(tiny_data) if a == "DATA" else a for a in argv]
    assert message in one_line_error(capsys, argv)
    assert not (tmp_path / "r").exists()


def test_steps_and_tokens_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "cs336-tiny", "--steps", "5", "--tokens", "500"]) == 2
    err = capsys.readouterr().err
    assert "argument --tokens: not allowed with argument --steps" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "options",
    [
        "block=sandwich, window[0]=4, attn_softcap=20.0, logit_softcap=15.0, embed_scale=4.0",
        "block=parallel(norms=2), qkv_bias=true, out_bias=true, qk_norm=rmsnorm, "
        "qk_norm_scope=full, ffn[1]=geglu",
    ],
)
def test_train_takes_todays_options_and_the_run_generates_and_loads(
    options: str, tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    spec = f"{TINY_SPEC}, {options}"
    argv = ["train", spec, "--data", str(tiny_data), "--out", str(run), "--steps", "6",
            "--eval-every", "3", "--log-every", "1", "--lr", "3e-3", *FAST]  # fmt: skip
    assert main(argv) == 0
    assert f"spec: {lmcore.parse_spec(spec)}" in capsys.readouterr().out
    losses = [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]
    assert len(losses) == 6 and all(loss == loss for loss in losses)  # finite, no NaN
    model = lmcore.load(run)
    assert model.spec == lmcore.parse_spec(spec)
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.equal(model.generate(prompt, 5, GREEDY),
                       model.generate(prompt, 5, GREEDY, cache=False))  # fmt: skip


def test_a_full_disk_during_a_checkpoint_keeps_the_older_ones(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], single_thread: None,
) -> None:  # fmt: skip
    run = tmp_path / "run"
    disk_full_after(monkeypatch, 2)  # step 1's model and trainer state; step 2's model fails
    code = main(["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps",
                 "3", "--batch-size", "2", "--eval-batches", "1", "--save-every", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"lmcore train: error: cannot save checkpoint {run}/checkpoints/step-000002: No space "
        "left on device; the checkpoints before it are whole: free space (or move the run), "
        f"then continue with lmcore train --resume {run}\n"
    )
    assert [c.step for c in checkpoints(run)] == [1]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0
    assert read_run(run)["status"]["state"] == "done"


def test_a_stub_left_by_a_killed_start_is_reused(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], single_thread: None
) -> None:
    # The probe: an aborted torchrun start left a run directory that a new start refused. A
    # stub: run.json still "starting", nothing trained (killed before it could remove it).
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"format": "lmcore-run", "version": 1,
                                              "tag": "t", "status": {"state": "starting"}}))  # fmt: skip
    (run / "tokenizer.json").write_text("{}")
    code = main(["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), "--steps", "1",
                 "--batch-size", "2", "--eval-batches", "1"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert read_run(run)["status"]["state"] == "done"


def test_the_command_line_names_the_fix(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from lmcore.cli.main import main

    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    code = main(["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(tmp_path / "r"),
                 "--parallel", "ddp"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchrun --nproc-per-node N -m lmcore train" in err


def test_a_tracker_that_is_not_installed_names_its_extra(
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a)
    )
    argv = ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(tmp_path / "r"),
            "--steps", "2", "--logger", "mlflow"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "lmcore train: error: --logger mlflow needs the 'mlflow' extra: pip install 'lmcore-registry[mlflow]'\n"
    )
    assert not (tmp_path / "r").exists()
    assert main([*argv[:-1], "comet"]) == 2
    assert "argument --logger: invalid choice: 'comet'" in capsys.readouterr().err
