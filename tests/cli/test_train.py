"""`lmcore train`, `lmcore quickstart` on the command line: the report, Ctrl-C, resuming, errors."""

from __future__ import annotations

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
from lmcore.train import quickstart as qs
from lmcore.train.runs import checkpoints, latest_checkpoint, read_metrics, read_run
from tests.helpers import TINY_SPEC, tiny_corpus

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
        "optimizer: AdamW (fused), lr 0.003 → 0.0003 (warmup 4, cosine to step 40), betas 0.9 "
        "0.95, weight decay 0.1 on matrices, clip 1"
    )
    vals = [float(m[1]) for m in re.finditer(r"^step +\d+  val (\d+\.\d+)", captured.out, re.M)]
    assert len(vals) == 3 and vals[0] > vals[1] > vals[2]
    assert re.fullmatch(r"step 20  val \d\.\d{4}  ppl [\d,.]+  train \d\.\d{4}  [\d,]+ tok/s  "
                        r"\d+\.\d s", lines[7])  # fmt: skip
    assert re.fullmatch(
        rf"done: 40 steps, 5,120 tokens in \d+\.\d s \([\d,]+ tokens/s while training\); val "
        rf"loss {vals[0]:.4f} → {vals[2]:.4f}",
        lines[9],
    )
    ckpt = run / "checkpoints" / "step-000040"
    assert lines[10] == f"checkpoint: {ckpt} (model: {ckpt / 'model.safetensors'})"
    assert lines[11] == f"metrics: {run / 'metrics.jsonl'}, loss curve: {run / 'loss.png'}"
    assert len(lines) == 12
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
        (["train", "cs336-tiny, vocab_size=256", "--data", "DATA", "--out", "r"], "the model's "
         "vocab_size=256 is smaller than the data's 277 tokens"),
        (["train", "--resume", "r", "--out", "x"], "--resume r continues that run in its own "
         "directory: give neither SPEC nor --out with it"),
        (["train", "--resume", "DATA"], "is not a run directory: it has no run.json"),
        (["train", "nope.safetensors", "--data", "DATA", "--out", "r"], "nope.safetensors: no such file"),
        (["compare", "DATA"], "is not a run directory: it has no run.json"),
        (["sweep", "ckpt.safetensors", "--vary", "norm=none", "--data", "DATA", "--out", "s"],
         "BASE 'ckpt.safetensors' looks like a checkpoint path; a sweep trains every model from "
         "the start"),
        (["quickstart", "--data", "DATA"], "holds other prepared data (277 tokens from"),
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
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.err.startswith(f"lmcore {argv[0]}: error: ")
    assert message in captured.err
    assert captured.err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_steps_and_tokens_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "cs336-tiny", "--steps", "5", "--tokens", "500"]) == 2
    err = capsys.readouterr().err
    assert "argument --tokens: not allowed with argument --steps" in err
    assert err.count("\n") == 1


def test_quickstart_prepares_once_and_prints_the_falling_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tiny_corpus(tmp_path / "stdlib")  # stands in for the standard library: fast
    monkeypatch.setattr(qs, "stdlib", lambda: fake)
    monkeypatch.chdir(tmp_path)
    assert main(["quickstart", "--steps", "12", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("quickstart: a small model learns Python from this Python's")
    assert lines[2] == (
        f"  lmcore data prepare {fake} --ext .py --exclude site-packages --exclude test "
        "--vocab-size 2048 --out data/stdlib-2k"
    )
    assert lines[3] == (
        f"  lmcore train '{qs.QUICKSTART_SPEC}' --data data/stdlib-2k --out runs/quickstart "
        "--steps 12 --batch-size 16 --lr 0.003 --eval-every 20 --eval-batches 4 --save-every 0"
    )
    assert "data: data/stdlib-2k: train.bin, val.bin (uint16), tokenizer.json, meta.json" in lines
    vals = [float(m[1]) for m in re.finditer(r"^step +\d+  val (\d+\.\d+)", out, re.M)]
    assert len(vals) == 2 and vals[1] < vals[0] - 1
    assert read_run("runs/quickstart")["status"]["state"] == "done"
    # again: the data is reused, the run goes to the next free directory
    assert main(["quickstart", "--steps", "2", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "data: data/stdlib-2k holds the standard library already; reusing it" in out
    assert "run: runs/quickstart-2  (tag L4-d128-rmsnorm-swiglu-rope-" in out
    meta = json.loads((tmp_path / "data/stdlib-2k/meta.json").read_text())
    assert meta["sources"][0]["path"] == str(fake)


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
