"""`lmcore generate`: token ids from a spec, text from a checkpoint with the tokenizer beside it,
in its run directory or in the data directory its run names; every error exits 2 in one line,
naming the fix (a prompt that is not UTF-8, one longer than the context)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models

import lmcore
from lmcore.cli.main import main
from lmcore.data import EOT
from lmcore.model.generate import GREEDY, Sampling
from lmcore.runfiles import CHECKPOINT_FILES, MODEL_FILE, RUN_FORMAT, RUN_VERSION, TOKENIZER_FILE
from tests.helpers.runs import PROBE_SPEC, byte_level_bpe, pruned_on_first_read

SPEC = "vocab_size=300, context_length=32, d_model=32, num_layers=2, num_heads=4, d_ff=64"


TEXT = "Once upon a time there was a little dog. The dog liked to run and play in the sun. "


def make_tokenizer(path: Path) -> Tokenizer:
    """A byte-level BPE of at most 300 tokens, EOT first, written to `path`."""
    tok = byte_level_bpe([TEXT] * 20, 300)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def saved_model(path: Path) -> lmcore.TransformerLM:
    torch.manual_seed(0)
    model = lmcore.build_model(SPEC)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    lmcore.save(model, path)
    return model


def run_dir(root: Path, data: Path | None = None) -> Path:
    """A run directory laid out as `lmcore train` writes it, with one checkpoint (its trainer
    files empty: generation reads only the model; the tokenizer is up to the test)."""
    step = root / "checkpoints" / "step-000010"
    step.mkdir(parents=True)
    info = {
        "format": RUN_FORMAT,
        "version": RUN_VERSION,
        "data": {"path": str(data)} if data else {},
    }
    (root / "run.json").write_text(json.dumps(info), encoding="utf-8")
    for name in set(CHECKPOINT_FILES) - {MODEL_FILE, TOKENIZER_FILE}:
        (step / name).touch()
    return step / MODEL_FILE


def test_token_ids_from_a_spec_are_greedy_and_the_rate_goes_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["generate", SPEC, "--prompt-ids", "1,2,3", "--max-new-tokens", "6"]
    assert main([*args, "--temperature", "0", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    torch.manual_seed(0)
    expected = lmcore.build_model(SPEC).generate(torch.tensor([1, 2, 3]), 6, GREEDY)
    assert out == " ".join(map(str, expected.tolist())) + "\n"
    assert "lmcore generate: 6 tokens in " in err and " tokens/s (KV cache, prompt 3 tokens" in err
    assert main([*args, "--temperature", "0", "--no-cache"]) == 0
    assert capsys.readouterr().out == out


@pytest.mark.parametrize("where", ["beside", "run", "data"])
def test_text_from_a_checkpoint_with_the_tokenizer_it_was_trained_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    data = tmp_path / "data"
    ckpt = run_dir(tmp_path / "run", data)
    model = saved_model(ckpt)
    tok_dir = {"beside": ckpt.parent, "run": tmp_path / "run", "data": data}[where]
    tok = make_tokenizer(tok_dir / "tokenizer.json")
    prompt = tok.encode("Once upon a").ids
    new = model.generate(torch.tensor(prompt), 8, GREEDY, stop_token=tok.token_to_id(EOT)).tolist()
    # The model file; or the run, whose newest complete checkpoint holds the tokenizer.
    for target in (ckpt, tmp_path / "run") if where == "beside" else (ckpt,):
        code = main(["generate", str(target), "--prompt", "Once upon a", "--max-new-tokens", "8",
                     "--temperature", "0"])  # fmt: skip
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out == tok.decode(new) + "\n"
        assert f"lmcore generate: {len(new)} tokens" in err


def test_a_text_prompt_without_a_tokenizer_names_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = run_dir(tmp_path / "run", tmp_path / "data")
    saved_model(ckpt)
    assert main(["generate", str(ckpt), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    looked = ", ".join(str(p) for p in (ckpt.parent, ckpt.parent.parent, tmp_path / "run"))
    assert err == (
        f"lmcore generate: error: --prompt needs a tokenizer, but none was found for "
        f"'{ckpt}' (looked for tokenizer.json in {looked}, {tmp_path / 'data'}); pass "
        "--tokenizer PATH (e.g. the tokenizer.json lmcore data prepare wrote), or give token "
        "ids with --prompt-ids 1,2,3\n"
    )
    assert main(["generate", SPEC, "--prompt", "hi"]) == 2
    assert "(a spec has no tokenizer); pass --tokenizer PATH" in capsys.readouterr().err


def test_an_unreadable_run_json_is_named_when_no_tokenizer_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = run_dir(tmp_path / "run", tmp_path / "data")
    saved_model(ckpt)
    (tmp_path / "run" / "run.json").write_text('{"format": "lmcore-run", "version": 99}')
    assert main(["generate", str(ckpt), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    looked = ", ".join(str(p) for p in (ckpt.parent, ckpt.parent.parent, tmp_path / "run"))
    assert (
        f"(looked for tokenizer.json in {looked}; the run's data directory is unknown: "
        f"{tmp_path / 'run' / 'run.json'} has lmcore-run version 99; this lmcore reads version "
        f"{RUN_VERSION}); pass --tokenizer PATH"
    ) in err
    # Token ids need no tokenizer: the run's model still generates.
    assert main(["generate", str(ckpt), "--prompt-ids", "1,2", "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt-ids", "1,x"], r"argument --prompt-ids: expected comma-separated token ids such as 1,2,3, got '1,x'"),
        (["--prompt-ids", "1,300"], r"token id 300 at index \(0, 1\) is out of range for vocab_size=300"),
        (["--prompt-ids", "1,2", "--max-new-tokens", "40"], r"a prompt of 2 tokens and max_new_tokens=40 need 41 positions, beyond context_length=32"),
        (["--prompt-ids", "1", "--top-p", "0"], r"top_p must be in \(0, 1\], got 0.0"),
        (["--prompt-ids", "1", "--tokenizer", "nowhere.json"], r"--tokenizer 'nowhere.json' does not exist"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["generate", SPEC, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lmcore generate: error: ")
    assert re.search(message, err), err


def test_an_explicit_tokenizer_serves_a_lone_checkpoint_and_stops_at_its_eot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = saved_model(tmp_path / "m.safetensors")
    tok = make_tokenizer(tmp_path / "elsewhere" / "tok.json")
    eot = tok.token_to_id(EOT)
    prompt = tok.encode("The dog").ids
    new = model.generate(
        torch.tensor(prompt), 10, Sampling(temperature=0.9, seed=3), stop_token=eot
    )
    code = main(["generate", str(tmp_path / "m.safetensors"), "--prompt", "The dog",
                 "--tokenizer", str(tmp_path / "elsewhere" / "tok.json"), "--max-new-tokens", "10",
                 "--temperature", "0.9", "--seed", "3"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == tok.decode(new.tolist()) + "\n"
    # With ids, the new ids are printed when there is no tokenizer to decode them.
    assert main(["generate", str(tmp_path / "m.safetensors"), "--prompt-ids", "5,6",
                 "--max-new-tokens", "3", "--temperature", "0"]) == 0  # fmt: skip
    expected = model.generate(torch.tensor([5, 6]), 3, GREEDY).tolist()
    assert capsys.readouterr().out == " ".join(map(str, expected)) + "\n"


def test_a_prompt_with_bytes_that_are_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: invalid UTF-8 in --prompt raised TypeError from tokenizers.
    tok = tmp_path / "tokenizer.json"
    Tokenizer(models.BPE()).save(str(tok))
    model = lmcore.build_model(PROBE_SPEC).save(tmp_path / "m.safetensors")
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
    model = lmcore.build_model(PROBE_SPEC).save(tmp_path / "m.safetensors")
    ids = ",".join(["1"] * 20)
    assert main(["generate", str(model), "--prompt-ids", ids, "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        "lmcore generate: error: the prompt is 20 tokens, more than context_length=16; a prompt "
        "of P tokens leaves room for 17 - P new ones: shorten it, e.g. to its last 8 tokens "
        "(room for 9); lmcore never drops tokens silently\n"
    )


def test_a_checkpoint_its_run_prunes_while_it_is_read_is_read_again_as_the_newest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe: `generate RUN` while RUN trained with --keep 1 escaped with a traceback when
    # the checkpoint listed was removed before its tensors were read.
    ckpt = run_dir(tmp_path / "run")
    saved_model(ckpt)
    make_tokenizer(tmp_path / "run" / "tokenizer.json")
    calls = pruned_on_first_read(monkeypatch)
    code = main(["generate", str(tmp_path / "run"), "--prompt", "Once", "--max-new-tokens", "2"])
    assert code == 0, capsys.readouterr().err
    assert [p.parent.name for p in calls] == ["step-000010", "step-000011"]


@pytest.mark.parametrize(
    ("count", "seconds", "shown"),
    [(2, 6.08, "0.329 tokens/s, 3.04 s/token"), (1, 1.0, "1 tokens/s"), (6, 0.5, "12 tokens/s"),
     (97, 100.0, "0.97 tokens/s, 1.03 s/token"), (5_000, 2.0, "2,500 tokens/s"),
     (0, 0.2, "0 tokens in 0.2 s")],
)  # fmt: skip
def test_a_rate_is_shown_with_its_digits_and_below_one_a_second_its_seconds(
    count: int, seconds: float, shown: str
) -> None:
    # The probe: 2 tokens in 6.09 s was reported as "0 tokens/s".
    from lmcore.cli.generate import per_second

    assert per_second(count, seconds) == shown
    assert count == 0 or float(shown.split()[0].replace(",", "")) == pytest.approx(
        count / seconds, rel=5e-3
    )
