"""Each command resolves its model once: `lmcore.blueprint.resolve` entered once from the command
line on, for every command and every kind of model argument (`lmcore.sources`)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmcore import blueprint
from lmcore.cli.main import main
from tests.helpers.models import TINY_SPEC


@pytest.fixture
def resolve_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
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
    resolve_calls: list[str],
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
        resolve_calls.clear()
        assert main(argv) == 0, (what, capsys.readouterr().err)
        entered[what] = list(resolve_calls)
    capsys.readouterr()
    assert {k: len(v) for k, v in entered.items()} == dict.fromkeys(commands, 1), entered
