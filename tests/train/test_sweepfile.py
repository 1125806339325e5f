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


def test_a_sweep_file_that_is_not_utf8_names_the_byte_and_its_line(tmp_path: Path) -> None:
    from lmcore.errors import TrainError
    from lmcore.train.sweepfile import read_definition
    from tests.helpers.errors import raises_naming

    path = tmp_path / "bad.toml"
    path.write_bytes(b'base = "cs336-tiny"\n# caf\xe9\nvariants = ["norm=none"]\n')
    offset = len(b'base = "cs336-tiny"\n# caf')  # the Latin-1 e-acute
    with raises_naming(TrainError, str(path), f"not UTF-8 at byte {offset}", "line 2", "0xe9",
                       "save it as UTF-8"):  # fmt: skip
        read_definition(path)


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        ("seeds = 1_000_000_000", ("seeds: 1000000000 is out of range", "from 1 to 1000")),
        ("seeds = 1e9", ("seeds: must be an integer from 1 to 1000", "1000000000.0")),
        ("seeds = 0", ("seeds: 0 is out of range",)),
        ("[launcher]\nthreads = 1e9", ("launcher.threads: must be an integer", "1000000000.0")),
        ("[launcher]\ncpus_per_run = 100000", ("launcher.cpus_per_run: 100000 is out of range",
                                               "from 1 to 1024")),
        ("[launcher]\ngpus_per_run = 2.0", ("launcher.gpus_per_run: must be an integer", "2.0")),
    ],
)  # fmt: skip
def test_counts_are_bounded_integers_before_they_size_anything(
    tmp_path: Path, text: str, facts: tuple[str, ...]
) -> None:
    from lmcore.errors import TrainError
    from lmcore.train.sweepfile import read_definition
    from tests.helpers.errors import raises_naming

    path = tmp_path / "s.toml"
    path.write_text(f'base = "cs336-tiny"\nvariants = ["norm=none"]\n{text}\n')
    with raises_naming(TrainError, str(path), *facts):
        read_definition(path)


def test_the_manual_states_the_bounds_the_code_holds() -> None:
    from lmcore.train.endpoints import CONNECT_TIMEOUT_S
    from lmcore.train.launch import MAX_GPUS, MAX_THREADS
    from lmcore.train.sweepfile import MAX_SEEDS
    from tests.helpers.errors import assert_naming

    docs = Path(__file__).resolve().parents[2] / "docs"
    page = " ".join((docs / "sweeps.md").read_text(encoding="utf-8").split())
    assert_naming(page, f"N from 1 to {MAX_SEEDS}", f"`seeds` 1 to {MAX_SEEDS}",
                  f"`cpus_per_run` 1 to {MAX_THREADS}", f"`gpus_per_run` 0 to {MAX_GPUS}",
                  f"connect timeout of {CONNECT_TIMEOUT_S:g} s",
                  "AF_UNIX's 107 bytes (103 on macOS)")  # fmt: skip
    trackers = " ".join((docs / "evaluation.md").read_text(encoding="utf-8").split())
    assert_naming(trackers, f"each within {CONNECT_TIMEOUT_S:g} s")
    cli = docs.parent / "lmcore" / "cli" / "sweep.py"  # --ray-address's help, kept light
    assert_naming(cli.read_text(encoding="utf-8"), f"timeout of {CONNECT_TIMEOUT_S:g} s")
