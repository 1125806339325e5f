"""Sweep files: the manual's is the one it shows; a value TOML cannot hold is a TrainError."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_manuals_sweep_file_is_the_one_it_shows() -> None:
    from lmcore.train.sweepfile import read_definition

    docs = Path(__file__).resolve().parents[2] / "docs"
    page = (docs / "sweeps.md").read_text(encoding="utf-8")
    shown = page.split("```toml\n", 1)[1].split("```", 1)[0]
    assert shown == (docs / "positions.toml").read_text(encoding="utf-8")
    defn = read_definition(docs / "positions.toml")
    assert (defn.variants, defn.seeds, defn.match) == (("pos=nope", "pos=alibi"), 3, "params")
    assert defn.train["tokens"] == 409_600 and defn.launcher.threads == 1


def test_a_value_toml_cannot_hold_is_a_train_error(tmp_path: Path) -> None:
    from lmcore.errors import TrainError
    from lmcore.train.sweepfile import read_definition

    path = tmp_path / "s.toml"
    path.write_text('base = "cs336-tiny"\n[launcher.slurm]\npartition = 1979-05-27\n')
    with pytest.raises(TrainError, match=r"no TOML for datetime.date\(1979, 5, 27\)"):
        read_definition(path).to_toml()
