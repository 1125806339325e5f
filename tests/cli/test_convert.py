"""`lmcore convert`: its usage (the conversions themselves are tested with tests/hf and
tests/gguf)."""

from __future__ import annotations

from lmcore.cli.main import main


def test_convert_needs_one_direction(capsys) -> None:
    assert main(["convert"]) == 2  # usage errors: one line, status 2 (issue 11)
    assert (
        "one of the arguments --from-hf --to-hf --from-gguf --to-gguf is required"
        in capsys.readouterr().err
    )
