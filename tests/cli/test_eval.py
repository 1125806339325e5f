"""`lmcore eval --text/--data`: numbers that do not depend on the batch size, the report, a data
split with the data's tokenizer, errors in one line with the fix; --tasks without lm-eval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import lmcore
from lmcore.cli.main import main
from lmcore.data import EOT
from tests.helpers.runs import EVAL_SPEC, eval_model, pruned_on_first_read

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster


def test_the_numbers_do_not_depend_on_the_batch_size(
    eval_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = []
    for batch in (1, 3, 8, 64):
        for stride in (16, 5):
            args = ["eval", str(eval_checkpoint), "--text", str(eval_checkpoint / "a.py"),
                    str(eval_checkpoint / "b.py"), "--json", "--batch-size", str(batch),
                    "--stride", str(stride)]  # fmt: skip
            assert main(args) == 0
            out = json.loads(capsys.readouterr().out)
            seen.append((stride, out["nats"], out["bits_per_byte"], out["tokens"], out["bytes"]))
    assert len(set(seen)) == 2  # one result per stride, bit for bit, whatever the batch


def test_the_report_shows_loss_perplexity_and_bits_per_byte(
    eval_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(eval_checkpoint), "--text", str(eval_checkpoint / "a.py")]) == 0
    out = capsys.readouterr().out
    assert f"model: {eval_checkpoint / 'model.safetensors'}" in out
    # 6 windows: one batch of 6, not the 8 asked for by default
    assert "windows: 6 of up to 16 tokens, stride 16 (non-overlapping), batch 6\n" in out
    assert "nats/token" in out and "perplexity" in out and "bits per byte" in out
    assert len(out.splitlines()) <= 8


def test_data_split_is_evaluated_with_the_datas_tokenizer(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmcore.data.tokens import TokenData

    torch.manual_seed(0)
    lmcore.save(lmcore.build_model(EVAL_SPEC), tmp_path / "m.safetensors")
    assert main(["eval", str(tmp_path / "m.safetensors"), "--data", str(tiny_data), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    data = TokenData.open(tiny_data)
    val = np.asarray(data.val)
    assert out["tokens"] == len(val) - 1 and out["source"] == f"val split of {tiny_data}"
    assert out["bytes"] == len(data.decode(val[1:]).replace(EOT, "").encode("utf-8"))


def test_eval_errors_are_one_line_with_the_fix(
    eval_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lone = tmp_path / "lone"
    lone.mkdir()
    lmcore.save(eval_model(), lone / "model.safetensors")
    assert main(["eval", str(lone), "--text", str(eval_checkpoint / "a.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmcore eval: error: no tokenizer found for") and "--tokenizer" in err
    assert len(err.splitlines()) == 1
    argv = ["eval", str(eval_checkpoint), "--text", str(eval_checkpoint / "a.py"), "--stride", "40"]
    assert main(argv) == 2
    assert "--stride 40: must be in 1..16" in capsys.readouterr().err
    assert main(["eval", str(eval_checkpoint), "--text", "nope.txt"]) == 2
    assert "--text 'nope.txt' is not a file" in capsys.readouterr().err
    assert (
        main(
            ["eval", str(eval_checkpoint), "--text", str(eval_checkpoint / "a.py"), "--limit", "3"]
        )
        == 2
    )
    assert "--limit applies to --tasks only" in capsys.readouterr().err


def test_tasks_without_lm_eval_name_the_extra(
    eval_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "lmcore.eval.harness", raising=False)
    assert main(["eval", str(eval_checkpoint), "--tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "lmcore eval: error: --tasks needs the 'eval' extra (lm-evaluation-harness): "
        "pip install 'lmcore-registry[eval]' (no module named 'lm_eval')"
    )
    assert len(err.splitlines()) == 1


def test_a_checkpoint_its_run_prunes_while_it_is_read_is_read_again_as_the_newest(
    eval_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # The probe: `eval RUN` while RUN trained with --keep 1 escaped with a FileNotFoundError
    # naming no file when the checkpoint listed was removed before its tensors were read.
    import shutil

    from lmcore.runfiles import RUN_FORMAT, RUN_VERSION

    run = tmp_path / "run"
    shutil.copytree(eval_checkpoint, run / "checkpoints" / "step-000010")
    (run / "run.json").write_text(json.dumps({"format": RUN_FORMAT, "version": RUN_VERSION}))
    calls = pruned_on_first_read(monkeypatch)
    text = str(eval_checkpoint / "a.py")
    assert main(["eval", str(run), "--text", text]) == 0, capsys.readouterr().err
    assert [p.parent.name for p in calls] == ["step-000010", "step-000011"]
    assert f"model: {run / 'checkpoints' / 'step-000011' / 'model.safetensors'}" in (
        capsys.readouterr().out
    )


def test_chat_data_is_scored_on_the_assistants_tokens_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `lmcore eval --data` of a chat split: its loss mask comes with it, as in the trainer
    pytest.importorskip("jinja2", reason="needs the 'chat' extra: pip install -e '.[chat]'")
    from lmcore.data.chat import prepare_chat
    from lmcore.data.tokens import TokenData
    from tests.helpers.chat import chat_checkpoint, conversations, write_chats

    ckpt = chat_checkpoint(tmp_path)
    saved = lmcore.read_info(ckpt).tokenizer
    assert saved is not None
    prepare_chat(write_chats(tmp_path / "c.jsonl", conversations(40)), tmp_path / "d",
                 tokenizer=saved, tokenizer_from=ckpt)  # fmt: skip
    data = TokenData.open(tmp_path / "d")
    val, mask = np.array(data.val), np.array(data.mask("val"))
    assert main(["eval", str(ckpt), "--data", str(tmp_path / "d"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kept = mask[1:] != 0
    assert 0 < kept.sum() < len(kept)
    assert (out["tokens"], out["masked"]) == (int(kept.sum()), int((~kept).sum()))
    assert out["source"] == f"val split of {tmp_path / 'd'} (loss-masked)"
    model = lmcore.load(ckpt)
    L = model.spec.context_length
    nats = 0.0
    with torch.no_grad():
        for s in range(0, len(val) - 1, L):
            x = torch.from_numpy(val[s : s + L]).long()
            y = torch.from_numpy(val[s + 1 : s + L + 1]).long()
            x, keep = x[: len(y)], torch.from_numpy(mask[s + 1 : s + L + 1] != 0)
            logp = model(x[None])[0].log_softmax(-1).gather(-1, y[:, None])[:, 0]
            nats -= float(logp[keep].double().sum())
    assert out["loss"] == pytest.approx(nats / kept.sum(), rel=1e-5)
    assert main(["eval", str(ckpt), "--data", str(tmp_path / "d")]) == 0
    text = capsys.readouterr().out
    assert f"{int((~kept).sum()):,} more read as context, left out by the loss mask" in text
