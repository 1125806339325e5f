"""What a command's model argument may be (a spec, a checkpoint file, directory or run, a Hugging
Face config), opened once: each kind told apart, built and given its tokenizer; and each command's
model resolved once (`lmcore.blueprint.resolve` entered once from the command line on)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore import blueprint
from lmcore.cli.common import UsageError
from lmcore.cli.main import main
from lmcore.errors import CheckpointError, EvalError, SpecError
from lmcore.sources import (
    is_checkpoint_path,
    locate,
    open_checkpoint,
    open_model,
    read_tokenizer,
    source_of,
)
from tests.helpers import TINY_SPEC

SMALL = "vocab_size=97, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory holding two checkpoints of SMALL, step 20 the newer."""
    root = tmp_path / "run"
    for step in (10, 20):
        torch.manual_seed(step)
        ckpt = root / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        lmcore.save(lmcore.build_model(SMALL), ckpt / "model.safetensors")
    (root / "run.json").write_text("{}")
    return root


def test_checkpoint_paths_are_told_from_specs() -> None:
    assert is_checkpoint_path("m.safetensors") and is_checkpoint_path("runs/step-100")
    assert not is_checkpoint_path("tinystories, pos=nope") and not is_checkpoint_path("gpt2-xl")
    assert not is_checkpoint_path('cs336-tiny, norm=mine(table="data/gains.txt")')


def test_each_kind_of_argument_is_located_without_reading_it(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newest = run / "checkpoints" / "step-000020" / "model.safetensors"
    assert locate("cs336-tiny, pos=nope").kind == "spec"
    assert locate("m.safetensors") == locate("m.safetensors", directories=True)
    assert locate(str(newest)).path == newest
    # a directory is a checkpoint directory or a run where a command takes directories
    assert locate(str(run), directories=True).path == newest
    assert locate(str(newest.parent), directories=True).path == newest
    assert locate(str(run)).path == run  # elsewhere a path, which read_info refuses
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    assert (locate(str(hf)).kind, locate(str(hf)).path) == ("hf", hf / "config.json")
    with pytest.raises(CheckpointError, match=r"neither a model file.*lmcore convert --from-hf"):
        locate(str(hf), directories=True)
    monkeypatch.chdir(hf)
    assert locate("config.json").kind == locate("config.json", directories=True).kind == "hf"


def test_a_source_is_resolved_once_and_builds_its_model(run: Path) -> None:
    spec = open_model(SMALL)
    assert (spec.kind, spec.info, spec.path) == ("spec", None, None)
    assert spec.blueprint.spec == lmcore.resolve(SMALL).spec
    assert spec.tokenizer_search().places == () and spec.saved_tokenizer is None
    torch.manual_seed(0)
    fresh = spec.model()
    torch.manual_seed(0)
    assert torch.equal(fresh.lm_head.weight, lmcore.build_model(SMALL).lm_head.weight)
    ckpt = open_model(str(run), directories=True)
    assert ckpt.kind == "checkpoint" and ckpt.info is not None
    assert ckpt.path == ckpt.info.path == run / "checkpoints" / "step-000020" / "model.safetensors"
    x = torch.randint(0, 97, (1, 16))
    assert torch.equal(ckpt.model()(x), lmcore.load(run)(x))
    assert ckpt.model(dtype=torch.bfloat16).lm_head.weight.dtype == torch.bfloat16
    assert ckpt.tokenizer_search().places  # beside it, up to its run
    with pytest.raises(CheckpointError, match=r"is a directory, not a checkpoint file"):
        open_model(str(run))  # build, describe, run and train take the file
    with pytest.raises(SpecError):
        open_model("nonsense-spec")


def test_python_callers_give_a_source_a_checkpoint_or_a_spec(run: Path) -> None:
    opened = open_checkpoint(run)
    assert source_of(opened) is opened
    assert source_of(opened.info).blueprint.spec == opened.blueprint.spec  # type: ignore[arg-type]
    assert source_of(opened.path).info == opened.info  # type: ignore[arg-type]
    bp = lmcore.resolve(SMALL)
    assert source_of(bp).blueprint is bp and source_of(SMALL).kind == "spec"
    with pytest.raises(SpecError):  # a string is a spec, as train() has always taken it
        source_of(str(opened.path))


def test_a_tokenizer_file_that_is_none_is_the_commands_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    for error in (UsageError, EvalError):
        with pytest.raises(error, match=r"is not a Hugging Face tokenizer.json"):
            read_tokenizer(bad, error)


# ------------------------------------------------------------------------------ resolved once


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each entry into `lmcore.blueprint.resolve` from now on, as the line that called it: the
    function, and every name a module imported it under."""
    original = blueprint.resolve
    calls: list[str] = []

    def counted(spec: object, registry: object = None) -> object:
        caller = traceback.extract_stack(limit=2)[0]
        calls.append(f"{Path(caller.filename).name}:{caller.lineno} {caller.name}")
        return original(spec, registry)  # type: ignore[arg-type]

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "lmcore" and getattr(module, "resolve", None) is original:
            monkeypatch.setattr(module, "resolve", counted)
    monkeypatch.setattr(blueprint, "resolve", counted)
    yield calls


@pytest.mark.usefixtures("single_thread")
def test_each_commands_model_is_resolved_once(
    tiny_data: Path,
    tmp_path: Path,
    resolutions: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step-000001" / "model.safetensors"
    budget = ["--steps", "1", "--batch-size", "2", "--eval-batches", "1", "--device", "cpu"]
    commands = {
        "train": ["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), *budget],
        "train CKPT": ["train", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "again"), *budget],
        "train --resume": ["train", "--resume", str(run), "--steps", "2"],
        "build": ["build", TINY_SPEC],
        "build CKPT": ["build", str(ckpt)],
        "describe CKPT": ["describe", str(ckpt)],
        "run": ["run", TINY_SPEC, "--steps", "1", "--device", "cpu"],
        "generate RUN": ["generate", str(run), "--prompt-ids", "1", "--max-new-tokens", "1", "--device", "cpu"],
        "generate": ["generate", TINY_SPEC, "--prompt-ids", "1", "--max-new-tokens", "1", "--device", "cpu"],
        "eval RUN": ["eval", str(run), "--data", str(tiny_data), "--device", "cpu"],
    }  # fmt: skip
    entered = {}
    for what, argv in commands.items():
        resolutions.clear()
        assert main(argv) == 0, (what, capsys.readouterr().err)
        entered[what] = list(resolutions)
    capsys.readouterr()
    assert {k: len(v) for k, v in entered.items()} == dict.fromkeys(commands, 1), entered
