"""Sampling at a temperature below float's smallest: as good as greedy (the hostile probe's
`lmcore generate --temperature 1e-38` raised multinomial's RuntimeError)."""

from __future__ import annotations

import torch

from lmcore.model.generate import Sampling, sample


def test_a_temperature_below_floats_smallest_is_as_good_as_greedy() -> None:
    # The probe: --temperature 1e-38 (1e-40, 1e-320, 5e-324) raised multinomial's RuntimeError.
    logits = torch.tensor([[1.0, 3.0, 2.5, -torch.inf], [0.0, 0.0, 9.0, 1.0]])
    for t in (1e-38, 1e-40, 1e-320, 5e-324):
        assert sample(logits, Sampling(temperature=t)).tolist() == [1, 2]
