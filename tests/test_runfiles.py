"""Where lmcore's files lie: a run's checkpoint directories, the model file a path names (and the
error for a directory that names none), a model's tokenizer search; every file name of the
layout defined once."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from lmcore import runfiles
from lmcore.errors import CheckpointError
from lmcore.runfiles import (
    MODEL_FILE,
    RUN_FILE,
    RUN_FORMAT,
    RUN_VERSION,
    TOKENIZER_FILE,
    find_checkpoint,
    find_tokenizer,
    step_dir,
    step_dirs,
)
from tests.helpers.errors import raises_naming

ROOT = Path(runfiles.__file__).resolve().parent


def a_run(root: Path, *steps: int, data: Path | None = None) -> Path:
    """A run directory with an (empty) model file in each step's checkpoint directory."""
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (root / "checkpoints" / step_dir(step)).mkdir(parents=True)
        (root / "checkpoints" / step_dir(step) / MODEL_FILE).touch()
    info = {
        "format": RUN_FORMAT,
        "version": RUN_VERSION,
        "data": {"path": str(data)} if data else {},
    }
    (root / RUN_FILE).write_text(json.dumps(info), encoding="utf-8")
    return root


def test_a_runs_checkpoints_are_its_step_directories_and_the_newest_is_its_model(
    tmp_path: Path,
) -> None:
    run = a_run(tmp_path / "run", 10, 200, 30)
    (run / "checkpoints" / ".step-000300.1a2b.tmp").mkdir()  # an interrupted save: not a step
    assert [s for s, _ in step_dirs(run)] == [10, 30, 200]
    newest = run / "checkpoints" / "step-000200" / MODEL_FILE
    assert find_checkpoint(run) == newest
    assert find_checkpoint(newest.parent) == newest
    assert find_checkpoint(newest) == newest
    assert find_checkpoint(tmp_path / "missing.safetensors") == tmp_path / "missing.safetensors"


def test_a_directory_that_names_no_model_file_is_refused_with_what_it_may_be(
    tmp_path: Path,
) -> None:
    empty = a_run(tmp_path / "empty")
    with pytest.raises(CheckpointError, match=r"has no checkpoint yet .*lmcore train --resume"):
        find_checkpoint(empty)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(CheckpointError, match=r"neither a model file, .*nor a run directory") as e:
        find_checkpoint(other)
    assert "config.json" not in str(e.value)
    (other / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"lmcore convert --from-hf .*other OUT"):
        find_checkpoint(other)


def test_the_tokenizer_search_goes_from_the_model_up_to_its_run_then_its_data(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    run = a_run(tmp_path / "run", 10, data=data)
    model = find_checkpoint(run)
    search = find_tokenizer(model, {})
    assert search.found is None and search.problem is None
    assert search.places == (
        model.parent.resolve() / TOKENIZER_FILE,
        model.parent.parent.resolve() / TOKENIZER_FILE,
        run.resolve() / TOKENIZER_FILE,
        data / TOKENIZER_FILE,
    )
    assert search.looked().startswith(f"looked for {TOKENIZER_FILE} in {model.parent.resolve()}, ")
    (data / TOKENIZER_FILE).touch()
    assert find_tokenizer(model, {}).found == data / TOKENIZER_FILE
    (run / TOKENIZER_FILE).touch()
    assert find_tokenizer(model, {}).found == run.resolve() / TOKENIZER_FILE
    (model.parent / "mine.json").touch()
    named = find_tokenizer(model, {"train.tokenizer": "mine.json"})  # what the runner records
    assert named.found == model.parent / "mine.json" and named.places[0] == named.found


def test_an_unreadable_run_json_is_what_the_search_could_not_read(tmp_path: Path) -> None:
    run = a_run(tmp_path / "run", 10)
    (run / RUN_FILE).write_text("{not json")
    search = find_tokenizer(find_checkpoint(run), {})
    assert search.found is None and search.problem is not None
    assert search.unknown() == f"; the run's data directory is unknown: {search.problem}"
    lone = tmp_path / "m.safetensors"
    assert find_tokenizer(lone, {}).places == (tmp_path.resolve() / TOKENIZER_FILE,)


# Names that happen to equal one of lmcore's: Hugging Face's own weights file.
OTHER_FORMATS = {("lmcore/hf/convert.py", "WEIGHTS")}


def test_each_file_name_of_the_layout_is_defined_here_alone() -> None:
    """No other module defines a constant holding one of the layout's file names."""
    values = {
        getattr(runfiles, n): n
        for n in runfiles.__all__
        if n.isupper() and isinstance(getattr(runfiles, n), str)
    }
    elsewhere = []
    for path in sorted(ROOT.rglob("*.py")):
        where = path.relative_to(ROOT.parent).as_posix()
        if where == "lmcore/runfiles.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
                node.value, ast.Constant
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    name = t.id if isinstance(t, ast.Name) else "?"
                    if node.value.value in values and (where, name) not in OTHER_FORMATS:
                        elsewhere.append(f"{where}:{node.lineno}: {name} (runfiles' "
                                         f"{values[node.value.value]})")  # fmt: skip
    assert not elsewhere, "\n".join(elsewhere)


def test_a_checkpoint_pruned_while_it_is_read_is_read_again_as_the_newest(tmp_path: Path) -> None:
    # A training run with --keep 1: a newer checkpoint is saved and the one listed removed
    # between the listing and the reading, twice; the third reading finds its file.
    import shutil

    run = a_run(tmp_path / "run", 1)
    read: list[int] = []

    def use(file: Path) -> int:
        step = int(file.parent.name.removeprefix("step-"))
        read.append(step)
        if len(read) < 3:  # the run saves step + 1, then prunes this one
            a_run(run, step + 1)
            shutil.rmtree(file.parent)
            raise FileNotFoundError(f"No such file or directory: {file}")  # as safetensors says
        return step

    assert runfiles.with_checkpoint(run, use) == 3 and read == [1, 2, 3]


def test_reading_again_is_bounded_and_only_for_a_checkpoint_that_vanished(tmp_path: Path) -> None:
    import shutil

    run = a_run(tmp_path / "run", 1)

    def vanishing(file: Path) -> None:
        step = int(file.parent.name.removeprefix("step-"))
        a_run(run, step + 1)
        shutil.rmtree(file.parent)
        raise CheckpointError(f"{file}: no such file")

    with raises_naming(CheckpointError, "run", "removed while it was read, 3 times",
                       "--keep", "try again"):  # fmt: skip
        runfiles.with_checkpoint(run, vanishing, attempts=3)
    assert [s for s, _ in step_dirs(run)] == [4]  # three readings, no more

    calls: list[Path] = []

    def damaged(file: Path) -> None:  # the file is there: its own error, at once
        calls.append(file)
        raise CheckpointError(f"{file}: is truncated")

    with pytest.raises(CheckpointError, match="is truncated"):
        runfiles.with_checkpoint(run, damaged)
    assert len(calls) == 1
    gone = tmp_path / "gone.safetensors"  # not a run: nothing newer to read
    with pytest.raises(FileNotFoundError):
        runfiles.with_checkpoint(gone, lambda f: open(f, "rb"))
