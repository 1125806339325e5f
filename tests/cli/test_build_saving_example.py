"""The manual's "Saving and loading" example (docs/checkpoints.md), run as written: `lmcore build
--save`, `lmcore describe` of the file, then its Python block."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from lmcore.checkpoint import read_info
from tests.helpers.models import perturbed


def test_the_readme_saving_and_loading_example_runs(tmp_path: Path, monkeypatch) -> None:
    """The README's two commands, then its Python block, as written."""
    from lmcore.cli.main import main

    readme = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text()
    section = readme.split("\n## Saving and loading\n", 1)[1].split("\n### ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0].splitlines()
    assert commands == [
        'lmcore build "tinystories, pos=nope" --save m.safetensors',
        "lmcore describe m.safetensors",
    ]
    monkeypatch.chdir(tmp_path)
    assert main(["build", "tinystories, pos=nope", "--save", "m.safetensors"]) == 0
    assert main(["describe", "m.safetensors"]) == 0
    torch.save(perturbed("cs336-tiny").state_dict(), tmp_path / "ts_state_dict.pt")
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(block, "docs/checkpoints.md", "exec"), {})
    assert read_info(tmp_path / "copy.safetensors").metadata == {"note": "strings only"}
