"""Directory locks and whole-directory writes (`lmcore.locks`), and the commands that use them:
a second `train`, `--resume`, `sweep` or `data prepare` of a directory in use exits 2 naming the
holder; `data prepare --force` swaps a complete new directory in or leaves the old one whole."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmcore.cli.main import main
from lmcore.data import TokenData, prepare
from lmcore.errors import DataError, TrainError
from lmcore.locks import LOCK_FILE, Holder, lock_file, new_directory, sibling_lock
from lmcore.train.runs import lock_run, read_run
from tests.helpers.errors import raises_naming
from tests.helpers.models import TINY_SPEC, tiny_corpus

# "PID 123 on host, started 2026-01-01T00:00:00+00:00 (command)": the holder as named
HOST = re.escape(socket.gethostname())
HOLDER = rf"PID {os.getpid()} on {HOST}, started \d{{4}}-\d\d-\d\dT[^ ]+ \(.*\)"


def in_use(what: str, holder: str = HOLDER) -> str:
    return (
        rf"{what} is in use by another lmcore process: {holder}; wait for it to finish or "
        rf"stop it \(kill \d+\), then try again"
    )


def naming_in_use(what: str, holder: str = HOLDER) -> tuple[str | re.Pattern[str], ...]:
    """What `in_use` says, as the facts `raises_naming` looks for."""
    return (
        f"{what} is in use by another lmcore process: ",
        re.compile(holder),
        re.compile(r"wait for it to finish or stop it \(kill \d+\), then try again"),
    )


def test_a_second_lock_names_the_holder_and_is_free_after_release(tmp_path: Path) -> None:
    file = tmp_path / LOCK_FILE
    with lock_file(file, what="run directory r", error=TrainError) as held:
        assert held.held
        with raises_naming(TrainError, *naming_in_use("run directory r")):
            lock_file(file, what="run directory r", error=TrainError)
    assert not held.held and file.read_bytes() == b""  # the details go with the lock
    lock_file(file, what="run directory r", error=TrainError).release()


def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    file = tmp_path / LOCK_FILE
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from lmcore.errors import TrainError
            from lmcore.locks import lock_file
            lock = lock_file({str(file)!r}, what="x", error=TrainError)
            print("locked", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "locked\n"
        holder = rf"PID {child.pid} on {HOST}, started [^ ]+ \(-c\)"
        with raises_naming(DataError, *naming_in_use("--out d", holder)):
            lock_file(file, what="--out d", error=DataError)
        assert Holder.parse(file.read_bytes()) is not None
    finally:
        child.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel releases the lock
        child.wait()
    lock_file(file, what="--out d", error=DataError).release()


def test_a_lock_that_cannot_be_created_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        TrainError, match=r"cannot lock run directory r: .*/missing/\.lock: No such"
    ):
        lock_file(tmp_path / "missing" / LOCK_FILE, what="run directory r", error=TrainError)


# --- whole directories -----------------------------------------------------------------------


def write_dir(path: Path, **files: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)


def contents(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.iterdir())}


def test_a_new_directory_appears_whole_and_replaces_only_with_force(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kw = {"what": "--out", "error": DataError, "fix": "pass --force"}
    with new_directory(out, force=False, **kw) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.") and not out.exists()
        write_dir(tmp, a="1", b="2")
    assert contents(out) == {"a": "1", "b": "2"}
    refused = (
        f"--out '{out}' is not empty",
        "(it holds a, b)",
        "nothing was written",
        "pass --force",
    )
    with raises_naming(DataError, *refused), new_directory(out, force=False, **kw):
        pass
    with new_directory(out, force=True, **kw) as tmp:
        write_dir(tmp, c="3")
    assert contents(out) == {"c": "3"}  # replaced whole: nothing of the old one mixed in
    with pytest.raises(RuntimeError, match="boom"), new_directory(out, force=True, **kw) as tmp:
        write_dir(tmp, d="4")
        raise RuntimeError("boom")
    assert contents(out) == {"c": "3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_force_never_replaces_a_directory_holding_a_source(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_dir(out / "corpus", a="text")
    inside = (
        f"SOURCE '{out}/corpus' is inside --out '{out}'",
        "which --force would replace whole (deleting it)",
        "move it out first, or choose another path",
    )
    keep = [("SOURCE", out / "corpus")]
    with (
        raises_naming(DataError, *inside),
        new_directory(out, force=True, what="--out", error=DataError, fix="", keep_out=keep),
    ):
        pass
    assert contents(out / "corpus") == {"a": "text"}


def test_what_a_killed_writer_left_beside_the_directory_is_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_dir(out, a="1")
    write_dir(tmp_path / ".out.1234abcd.tmp", half="x")  # a writer killed mid-way
    write_dir(tmp_path / ".out.5678abcd.old", a="0")  # ... or before removing the old data
    write_dir(tmp_path / ".other.1234abcd.tmp", keep="x")  # another directory's: kept
    with new_directory(out, force=True, what="--out", error=DataError, fix="") as tmp:
        write_dir(tmp, b="2")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.1234abcd.tmp", ".out.lock", "out"
    ]  # fmt: skip


# --- the commands -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_corpus(tmp_path_factory.mktemp("locks") / "text")


def test_prepare_into_a_directory_in_use_exits_2_naming_the_holder(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d300"
    with lock_file(sibling_lock(out), what="x", error=DataError):  # another prepare of it
        code = main(["data", "prepare", str(corpus), "--out", str(out), "--vocab-size", "300"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not out.exists()
    assert re.fullmatch(f"lmcore data prepare: error: {in_use(f'--out {out}')}\n", err)


def test_prepare_force_keeps_the_old_data_when_the_new_fails(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: a non-UTF-8 source path with --force failed at the end (writing meta.json),
    # after the old train.bin, val.bin and tokenizer.json had been replaced. Now the path is
    # stored (as JSON's \udcff escape, read back to the same name), and any failure leaves the
    # old data whole.
    out = tmp_path / "x"
    prepare([corpus], out, vocab_size=300, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    odd = tmp_path / os.fsdecode(b"dir\xff")
    odd.mkdir()
    for p in sorted(corpus.iterdir())[:12]:
        (odd / p.name).write_bytes(p.read_bytes())
    assert main(["data", "prepare", str(odd), "--out", str(out), "--vocab-size", "300",
                 "--force"]) == 0  # fmt: skip
    meta = TokenData.open(out).meta
    assert meta.sources[0].path == str(odd) and meta.files == 12
    capsys.readouterr()
    (odd / "bad.py").write_bytes(b"caf\xe9")  # not UTF-8: this run fails at the end
    code = main(["data", "prepare", str(corpus), str(odd), "--out", str(out), "--vocab-size",
                 "300", "--force"])  # fmt: skip
    assert code == 2 and "bad.py: byte offset 3: b'\\xe9' is not valid UTF-8" in (
        capsys.readouterr().err
    )
    assert TokenData.open(out).meta.sources[0].path == str(odd)  # the last good data, whole
    prepare([corpus], out, vocab_size=300, progress=False, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()}.keys() == before.keys()
    # --skip-undecodable records the skipped non-UTF-8 file name
    skipped = tmp_path / "skipped"
    assert main(["data", "prepare", str(odd), str(corpus), "--out", str(skipped),
                 "--vocab-size", "300", "--skip-undecodable"]) == 0  # fmt: skip
    assert TokenData.open(skipped).meta.skipped == (
        f"{odd / 'bad.py'}: not UTF-8 at byte offset 3",
    )


def test_a_run_in_use_refuses_resume_and_a_second_start(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], single_thread: None
) -> None:
    run = tmp_path / "run"
    opts = ["--steps", "2", "--batch-size", "2", "--eval-batches", "1"]
    assert main(["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run), *opts]) == 0
    capsys.readouterr()
    before = (run / "metrics.jsonl").read_bytes()
    with lock_run(run):  # as a training process holds it
        assert main(["train", "--resume", str(run), "--steps", "4"]) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(f"lmcore train: error: {in_use(f'run directory {run}')}\n", err)
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        with lock_run(fresh):  # a start into the same new --out, a moment earlier
            code = main(["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(fresh)])
        assert code == 2 and in_use(f"run directory {fresh}")[:30] in capsys.readouterr().err
        assert sorted(p.name for p in fresh.iterdir()) == [LOCK_FILE]
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing written meanwhile
    assert main(["train", "--resume", str(run), "--steps", "3"]) == 0  # free again
    assert read_run(run)["status"]["step"] == 3


def test_a_sweep_in_use_is_refused(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    out.mkdir()
    with lock_file(out / LOCK_FILE, what="x", error=TrainError):
        code = main(["sweep", TINY_SPEC, "--vary", "norm=none", "--data", str(tiny_data),
                     "--out", str(out), "--steps", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and re.fullmatch(
        f"lmcore sweep: error: {in_use(f'sweep directory {out}')}\n", err
    )
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]


def test_a_start_that_fails_leaves_no_stub_run(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: --batch-size 1000000000 raised numpy's _ArrayMemoryError with a traceback and
    # left the run "running"; --resume repeated the crash and could not change the batch size.
    run = tmp_path / "oom"
    code = main(["train", TINY_SPEC, "--data", str(tiny_data), "--out", str(run),
                 "--batch-size", "1000000000", "--steps", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and not run.exists()
    assert re.fullmatch(
        r"lmcore train: error: out of memory with --batch-size 1,000,000,000 × context_length "
        r"16 = 16,000,000,000 tokens a step on cpu \(Unable to allocate .*\); use a smaller "
        r"--batch-size \(a run that had not started is not kept\)\n",
        err,
    )
