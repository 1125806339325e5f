"""Fixtures of the launcher tests: the sweep they all reproduce, trained here."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcore.train.sweep import sweep
from tests.helpers.models import TINY_SPEC
from tests.helpers.runs import sweep_config, sweep_val_losses


@pytest.fixture(scope="session")
def reference(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """The sweep of TINY_SPEC and pos=nope trained here, in this process, on one thread: every
    run's validation losses."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("local") / "sweep"
    return sweep_val_losses(
        sweep(TINY_SPEC, ["pos=nope"], tiny_data, out, sweep_config(), echo=None)
    )
