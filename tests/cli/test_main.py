"""The command line as a whole: the console script, --version and --help without torch, and
the exit-status contract every command keeps (bad input: 2 and one line; a malformed
variable; a bug keeps its traceback; output that cannot be written; ASCII terminals)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmcore import Registry, use_registry
from lmcore.cli.main import main
from tests.helpers.errors import assert_naming
from tests.helpers.runs import CHECKPOINT_SPEC


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("lmcore")
    out = subprocess.run(
        [script, "build", "cs336-tiny", "--device", "meta"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[1] == "parameters: 1,403,328"


def test_version_names_lmcore_torch_and_python(capsys) -> None:
    import platform

    import torch

    import lmcore

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == (
        f"lmcore {lmcore.__version__} (torch {torch.__version__}, "
        f"Python {platform.python_version()})\n"
    )


def test_help_and_version_stay_torch_free() -> None:
    import platform

    import torch

    import lmcore

    code = (
        "import sys; from lmcore.cli.main import main\n"
        "for argv in (['--help'], ['train', '--help'], ['quickstart', '--help'], ['--version']):\n"
        "    try: main(argv)\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    # torch's version as its installed metadata gives it, the same as the imported module's
    assert out.stdout.splitlines()[-1] == (
        f"lmcore {lmcore.__version__} (torch {torch.__version__}, "
        f"Python {platform.python_version()})"
    )


ANY_COMMAND = [
    ["build", "cs336-tiny", "--device", "meta"],
    ["describe", "cs336-tiny"],
    ["run", "cs336-tiny", "--steps", "1", "--device", "cpu"],
    ["plugins"],
]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["build", "cs336-tiny", "--device", "bogus"], "unknown device 'bogus'; use cpu, meta, cuda or cuda:N (or another torch device)"),
        (["run", "tinystories", "--batch", "1000000000000", "--max-bytes", "1TiB"], "a step of batch 1,000,000,000,000 × seq 128 needs"),
        (["run", "cs336-tiny", "--seed", "1180591620717411303424"], "argument --seed: expected an integer in 0 .. 2**64-1, got '1180591620717411303424' (see lmcore run --help)"),
        (["run", "cs336-tiny", "--seed", "-1"], "argument --seed: expected an integer in 0 .. 2**64-1, got '-1'"),
        (["run", "cs336-tiny", "--steps", "99999999999999999999999"], "argument --steps: expected a positive integer"),
        (["build", "cs336-tiny", "--max-bytes", "lots"], "argument --max-bytes: expected a number of bytes such as 8GiB, 500MB or 1000000, got 'lots'"),
        (["build", "cs336-tiny", "--max-bytes", "1MB"], "the model needs 5.35 MiB (5,614,336 bytes) for its float32 weights and buffers, more than the limit max_bytes=1,000,000"),
        (["build", "tinystories, num_layers=1000000", "--max-bytes", "8GiB"], "the model needs 11.33 TiB"),
        (["build", "tinystories, d_model=" + "1" * 41], "integer 1"),
        (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    first, *rest = captured.err.splitlines()
    assert message in first, captured.err
    # One line; a spec error adds only its caret display (the spec, then the carets).
    assert not rest or (len(rest) == 2 and set(rest[1].strip()) == {"^"}), captured.err


@pytest.mark.parametrize("argv", ANY_COMMAND, ids=lambda a: a[0])
@pytest.mark.parametrize(
    "variable, value",
    [("LMCORE_STRICT_PLUGINS", "maybe"), ("LMCORE_DISABLE_PLUGIN_AUTOLOAD", "2")],
)
def test_a_malformed_variable_exits_2_from_every_command(
    monkeypatch, capsys, argv: list[str], variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with use_registry(Registry()):  # a registry that has not read the variables yet
        assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"lmcore {argv[0]}: error: {variable}={value!r} is not a flag; "
        "use 1/true/yes or 0/false/no\n"
    )


def test_an_internal_error_is_not_dressed_as_bad_input(monkeypatch) -> None:
    """A bug in lmcore keeps its traceback (the console script then exits 1)."""
    import lmcore.model.transformer

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(lmcore.model.transformer, "build_model", broken)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        main(["build", "cs336-tiny"])


def run_cli(
    *argv: str, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[bytes]:
    cli = [sys.executable, "-c", "import sys; from lmcore.cli.main import main; sys.exit(main())"]
    return subprocess.run(
        [*cli, *argv],
        capture_output="stdout" not in kwargs,
        env={**os.environ, **(env or {})},
        **kwargs,
    )  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize(
    "argv",
    [["describe", "cs336-tiny"], ["run", "cs336-tiny", "--steps", "1", "--device", "cpu"]],
    ids=["describe", "run"],
)
def test_ascii_only_output_gets_ascii_stand_ins(argv: list[str]) -> None:
    out = run_cli(*argv, env={"PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    text = out.stdout.decode("ascii")  # every byte is ASCII
    assert " x " in text and "×" not in text  # 'batch 1 × seq 16' reads 'batch 1 x seq 16'


def test_an_ascii_terminal_still_shows_spec_errors() -> None:
    out = run_cli("build", "cs336-tiny, norm=rmsnorm(eps='é')", env={"PYTHONIOENCODING": "ascii"})
    assert out.returncode == 2
    assert out.stderr.decode("ascii").startswith(
        "lmcore build: error: argument 'eps' of norm 'rmsnorm' expects float, got str '?'"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_one_line_and_exit_1() -> None:
    with open("/dev/full", "wb") as full:
        out = run_cli("plugins", stdout=full, stderr=subprocess.PIPE)
    assert out.returncode == 1
    assert out.stderr.decode() == (
        "lmcore plugins: error: cannot write the output: [Errno 28] No space left on device\n"
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


def test_the_console_script_round_trip(tmp_path: Path) -> None:
    """The README's path, as a new user types it."""
    script = str(Path(sys.executable).with_name("lmcore"))
    path = tmp_path / "m.safetensors"
    subprocess.run(
        [script, "build", CHECKPOINT_SPEC, "--save", str(path)], check=True, capture_output=True
    )
    described = subprocess.run(
        [script, "describe", str(path)], check=True, capture_output=True, text=True
    )
    assert described.stdout.startswith(f"checkpoint: {path} (")


def test_a_system_error_naming_no_file_is_one_line_saying_what_was_being_done(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: `lmcore eval RUN` while RUN pruned its checkpoints escaped with safetensors'
    # FileNotFoundError, which names no file (its `filename` is None), as a traceback.
    import lmcore.model.transformer

    def vanished(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("No such file or directory: /r/step-000008/model.safetensors")

    monkeypatch.setattr(lmcore.model.transformer, "build_model", vanished)
    assert main(["build", "cs336-tiny"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert_naming(err, "lmcore build: error: FileNotFoundError: No such file or directory: "
                  "/r/step-000008/model.safetensors", "(while lmcore.cli.build.run ran", "try again")  # fmt: skip
