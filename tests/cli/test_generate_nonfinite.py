"""`lmcore generate` on a checkpoint holding NaN and inf weights: it warns with the loader's
message, once, and still generates (the loader itself: tests/model/test_weights.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmcore
from lmcore.cli.main import main
from lmcore.errors import NonFiniteWeightsWarning
from tests.helpers.models import non_finite_checkpoint


def test_generate_warns_of_non_finite_weights_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The probe: a NaN in ln_final made greedy `generate` exit 0 with empty output, unannounced.
    path = non_finite_checkpoint(tmp_path)
    with pytest.warns(NonFiniteWeightsWarning, match="not finite") as caught:
        lmcore.load(path)
    [message] = [str(w.message) for w in caught if w.category is NonFiniteWeightsWarning]
    code = main(["generate", str(path), "--prompt-ids", "1,2", "--temperature", "0",
                 "--max-new-tokens", "2", "--device", "cpu"])  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert code == 0 and err[0] == f"lmcore generate: warning: {message}"
