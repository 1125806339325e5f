"""A sweep's table ranks its variants by their mean loss or bits per byte."""

from __future__ import annotations

import pytest

from lmcore.errors import TrainError


def test_a_sweeps_variants_rank_by_their_mean_loss_or_bpb() -> None:
    from lmcore.train.summary import Summary, ranked_summaries

    def variant(label: str, loss: float | None, bpb: float | None = None) -> Summary:
        return Summary(label, "", None, None, 3, 3, loss, None, val_bpb=bpb)

    rows = [variant("baseline", 4.2, 2.1), variant("nope", 4.3), variant("alibi", 4.1, 2.2)]
    assert [s.label for s in ranked_summaries(rows, "val_loss")] == ["alibi", "baseline", "nope"]
    assert [s.label for s in ranked_summaries(rows, "val_bpb")] == ["baseline", "alibi", "nope"]
    with pytest.raises(TrainError, match=r"--sort 'tokens_per_s': a sweep's table ranks its "):
        ranked_summaries(rows, "tokens_per_s")
