from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lmcore import parse_spec
from lmcore.cli import main


def test_build_prints_the_canonical_spec_and_parameter_count(capsys) -> None:
    assert main(["build", "cs336-tiny, pos=nope"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(parse_spec("cs336-tiny, pos=nope")), "parameters: 1,403,328"]


def test_build_reports_spec_errors_with_a_caret_and_exit_code_2(capsys) -> None:
    assert main(["build", "tinystories, pos=rop"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(
        "lmcore build: error: no installed plugin provides pos 'rop' (did you mean 'rope'?)"
    )
    assert err[-2:] == ["  tinystories, pos=rop", "                   ^^^"]


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("lmcore")
    out = subprocess.run(
        [script, "build", "cs336-tiny", "--device", "meta"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[1] == "parameters: 1,403,328"
