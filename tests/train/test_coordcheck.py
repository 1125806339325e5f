"""lmcore.train.coordcheck: the slope against numpy's least squares, the spec at each width, and
the check's power: flat under muP, growing under the standard parametrization."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmcore.blueprint import resolve
from lmcore.errors import SpecError
from lmcore.train.coordcheck import TOLERANCE, at_width, coordinates, plot, slope, table

SPEC = "vocab_size=64, context_length=8, d_model=64, num_layers=1, num_heads=4, d_ff=32"


def test_slope_is_the_least_squares_fit_in_log_log() -> None:
    widths, values = [64, 128, 256, 512], [1.0, 1.7, 3.1, 6.5]
    want = np.polyfit(np.log(widths), np.log(values), 1)[0]
    assert slope(widths, values) == pytest.approx(want, rel=1e-12)
    assert slope(widths, [2.0] * 4) == pytest.approx(0.0, abs=1e-12)


def test_each_width_scales_d_ff_and_an_explicit_head_dim_and_keeps_the_heads() -> None:
    bp = resolve(f"{SPEC}, head_dim=8, query_scale=0.5")
    wide = at_width(bp, 256, "mup(base_width=64)").spec
    assert (wide.d_model, wide.d_ff, wide.head_dim, wide.num_heads) == (256, 128, 32, 4)
    assert wide.query_scale == 0.5 and str(wide.parametrization).startswith("mup(base_width=64")
    plain = at_width(resolve(SPEC), 128, None).spec
    assert (plain.head_dim, plain.parametrization) == (32, None)
    with pytest.raises(SpecError, match="per-layer values"):
        at_width(resolve(SPEC.replace("num_layers=1", "num_layers=2") + ", d_ff[1]=64"), 128, None)


def test_mup_is_flat_and_the_standard_parametrization_drifts(tmp_path: Path) -> None:
    bp = resolve(SPEC)
    train = dict(steps=3, lr=1e-2, batch=2, seq=8)
    mup = coordinates(bp, parametrization="mup(base_width=64,zero_head=true)", **train)
    sp = coordinates(bp, parametrization=None, **train)
    assert max(abs(s) for s in mup.slopes().values()) <= TOLERANCE
    assert sp.slopes()["0.ffn"] > 0.5 and sp.slopes()["0.attn"] > 0.5
    assert sp.slopes()["logits"] > TOLERANCE
    lines = table(mup, sp).splitlines()
    assert lines[0].split()[:5] == ["muP", "64", "128", "256", "512"]
    assert len(lines) == 2 * (1 + len(mup.scales))
    assert plot([mup, sp], tmp_path / "c.png").stat().st_size > 0
