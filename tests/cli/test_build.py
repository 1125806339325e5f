"""The command-line contract under the hostile probe's inputs: exit 2 and one line naming the
path, the size or the value and what to do (a full disk, memory, odd bytes, a closed stdout),
never a traceback. A full disk is simulated by making the write raise ENOSPC, as the kernel
does; `benchmarks/hardening.py` runs the same on a real 2 MB tmpfs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import lmcore
import lmcore.model.saving as saving
from lmcore.cli.main import main
from lmcore.model.generate import Sampling, sample
from lmcore.train.runs import checkpoints, read_run
from tests.helpers import TINY_SPEC

SPEC = "vocab_size=97, context_length=16, d_model=32, num_layers=1, num_heads=2, d_ff=64"
FULL = "; nothing was replaced: free space there, or write elsewhere"


def disk_full_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """safetensors' writes fail with ENOSPC after `writes` good ones, as on a full disk."""
    real, done = saving.save_file, [0]

    def save_file(*args: object, **kwargs: object) -> None:
        done[0] += 1
        if done[0] > writes:
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(saving, "save_file", save_file)


def test_build_save_onto_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.safetensors"
    disk_full_after(monkeypatch, 0)
    assert main(["build", SPEC, "--save", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"lmcore build: error: {out}: No space left on device{FULL}\n"
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary one


def test_save_onto_a_directory_names_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: --save/--from-hf OUT onto a directory named a hidden temporary file.
    assert main(["build", SPEC, "--save", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"lmcore build: error: {tmp_path}: is a directory; save to a file, e.g. "
        f"{tmp_path / 'model.safetensors'}\n"
    )
    assert list(tmp_path.iterdir()) == []


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


def test_a_temperature_below_floats_smallest_is_as_good_as_greedy() -> None:
    # The probe: --temperature 1e-38 (1e-40, 1e-320, 5e-324) raised multinomial's RuntimeError.
    logits = torch.tensor([[1.0, 3.0, 2.5, -torch.inf], [0.0, 0.0, 9.0, 1.0]])
    for t in (1e-38, 1e-40, 1e-320, 5e-324):
        assert sample(logits, Sampling(temperature=t)).tolist() == [1, 2]


def test_a_prompt_with_bytes_that_are_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: invalid UTF-8 in --prompt raised TypeError from tokenizers.
    from tokenizers import Tokenizer, models

    tok = tmp_path / "tokenizer.json"
    Tokenizer(models.BPE()).save(str(tok))
    model = lmcore.build_model(SPEC).save(tmp_path / "m.safetensors")
    prompt = os.fsdecode(b"a\xffb")  # how Python hands the command line's bytes over
    assert main(["generate", str(model), "--prompt", prompt, "--tokenizer", str(tok)]) == 2
    assert capsys.readouterr().err == (
        "lmcore generate: error: --prompt holds a byte that is not UTF-8 (0xff at character 1); "
        "give the prompt as UTF-8 text (e.g. convert it with iconv), or its ids with "
        "--prompt-ids\n"
    )


def test_a_prompt_longer_than_the_context_is_told_how_much_to_keep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: told to "truncate to the last 16 tokens", which leaves no room to generate.
    model = lmcore.build_model(SPEC).save(tmp_path / "m.safetensors")
    ids = ",".join(["1"] * 20)
    assert main(["generate", str(model), "--prompt-ids", ids, "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "lmcore generate: error: the prompt is 20 tokens, more than context_length=16; a prompt "
        "of P tokens leaves room for 17 - P new ones: shorten it, e.g. to its last 8 tokens "
        "(room for 9); lmcore never drops tokens silently\n"
    )


def test_a_closed_stdout_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # The probe: `lmcore plugins >&-` and `lmcore generate ... >&-` raised AttributeError.
    script = Path(sys.executable).parent / "lmcore"
    done = subprocess.run([str(script), "plugins"], stdout=subprocess.DEVNULL, check=False,
                          stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1))  # fmt: skip
    assert done.returncode == 1 and done.stderr == (
        "lmcore plugins: error: cannot write the output: stdout is closed; redirect it, e.g. > "
        "/dev/null to discard it\n"
    )


def test_metadata_strings_never_reach_the_terminal_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: ANSI escapes in metadata reached the terminal; a 10 MB version string printed
    # 30 MB.
    model = lmcore.build_model(SPEC)
    path = model.save(tmp_path / "m.safetensors", metadata={"note": "\x1b[31mred\x1b[0m"})
    assert main(["describe", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and r"metadata: note = '\x1b[31mred\x1b[0m'" in out
    from safetensors.torch import load_file, save_file

    header = _metadata(path)
    header["lmcore.lmcore_version"] = "9" * 10_000_000
    save_file(load_file(str(path)), str(path), metadata=header)
    assert main(["describe", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err) < 400 and re.fullmatch(
        rf"lmcore describe: error: {re.escape(str(path))}: has damaged lmcore metadata: "
        r"lmcore.lmcore_version is not a short printable string \('9999.*9999' \(10,000,000 "
        r"characters\)\); the file was edited or damaged after lmcore saved it\n",
        err,
    )


def _metadata(path: Path) -> dict[str, str]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return dict(json.loads(raw[8 : 8 + n])["__metadata__"])


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
