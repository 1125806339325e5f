"""What every launcher shares: SLURM's time formats, read as minutes."""

from __future__ import annotations

import pytest

from lmcore.train.launch import slurm_minutes


def test_slurm_times() -> None:
    assert [slurm_minutes(t) for t in ("90", "90:30", "1:30:00", "1-06", "2-00:00:30")] == [
        90, 91, 90, 1800, 2881,
    ]  # fmt: skip
    with pytest.raises(Exception, match=r"--slurm-time '1h': expected minutes, MM:SS"):
        slurm_minutes("1h")
