"""What a command's model argument may be (a spec, a checkpoint file, directory or run, a Hugging
Face config), opened once: each kind told apart, built and given its tokenizer; `lmcore.load` of a
file, a checkpoint directory or a run. Each command's model resolved once:
tests/cli/test_main_resolves_once.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.cli.common import UsageError
from lmcore.errors import CheckpointError, EvalError, SpecError
from lmcore.runfiles import find_checkpoint
from lmcore.sources import (
    could_be_path,
    is_checkpoint_path,
    locate,
    open_checkpoint,
    open_model,
    read_tokenizer,
    source_of,
)
from tests.helpers.errors import raises_naming
from tests.helpers.models import SMALL_SPEC as SMALL
from tests.helpers.models import perturbed, token_ids


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


def test_load_takes_a_checkpoint_directory_or_a_run_directory(tmp_path: Path) -> None:
    """What `lmcore generate` takes: a run directory loads its newest checkpoint's model."""
    run = tmp_path / "run"
    models = {}
    for step in (10, 200, 30):
        ckpt = run / "checkpoints" / f"step-{step:06d}"
        ckpt.mkdir(parents=True)
        models[step] = perturbed(SMALL, seed=step)
        lmcore.save(models[step], ckpt / "model.safetensors")
    (run / "checkpoints" / ".step-000300.1a2b.tmp").mkdir()  # an interrupted save: not a step
    (run / "run.json").write_text("{}")
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"has no checkpoint yet .*lmcore train --resume"):
        lmcore.load(empty)
    x = token_ids()
    newest = run / "checkpoints" / "step-000200"
    assert find_checkpoint(run) == newest / "model.safetensors"
    assert find_checkpoint(newest) == newest / "model.safetensors"
    assert find_checkpoint(newest / "model.safetensors") == newest / "model.safetensors"
    for path in (run, newest, newest / "model.safetensors"):
        assert torch.equal(lmcore.load(path)(x), models[200](x)), path
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    with raises_naming(
        CheckpointError,
        "neither a model file",
        "it holds a config.json",
        f"`lmcore convert --from-hf {hf} OUT.safetensors`",
    ):
        lmcore.load(hf)


# A canonical spec as lmcore prints it, longer than a file name may be (issue 32: "File name too
# long" from describe, build, run, train and generate).
LONG = str(
    lmcore.parse_spec(
        "vocab_size=300, context_length=32, d_model=32, num_layers=1, num_heads=2, "
        "ffn=moe(num_experts=4, shared=swiglu)"
    )
)


def test_a_spec_longer_than_a_file_name_is_never_tried_as_a_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(LONG.encode()) > 255
    looked: list[str] = []
    original = Path.is_dir
    monkeypatch.setattr(Path, "is_dir", lambda p: looked.append(str(p)) or original(p))
    for directories in (False, True):
        assert locate(LONG, directories=directories).kind == "spec"
    assert looked == []
    assert str(open_model(LONG).blueprint.spec) == LONG


def test_what_could_be_a_path() -> None:
    assert could_be_path("runs/quickstart") and could_be_path("a" * 255 + "/m.safetensors")
    assert not could_be_path("a" * 256) and not could_be_path("x\0y")
    assert not could_be_path("/".join(["a" * 200] * 21))  # 4,220 bytes: over PATH_MAX


def test_a_name_the_system_finds_too_long_is_a_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system whose names are shorter than 255 bytes says ENAMETOOLONG: not a path."""
    import errno

    def too_long(p: Path) -> bool:
        raise OSError(errno.ENAMETOOLONG, "File name too long", str(p))

    monkeypatch.setattr(Path, "is_dir", too_long)
    assert locate("cs336-tiny, pos=nope").kind == "spec"
    assert locate("cs336-tiny, pos=nope", directories=True).kind == "spec"
