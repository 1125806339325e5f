"""Run directories' names: equal models share a tag, others do not."""

from __future__ import annotations

import lmcore
from lmcore.train.runs import spec_tag


def test_equal_models_share_a_tag_and_others_do_not() -> None:
    a = lmcore.parse_spec("cs336-tiny")
    b = lmcore.parse_spec(str(a))  # the same model, written out in full
    c = lmcore.parse_spec("cs336-tiny, pos=nope")
    assert spec_tag(a) == spec_tag(b) and spec_tag(a) != spec_tag(c)
    assert spec_tag(lmcore.parse_spec("cs336-tiny, block=postnorm")).startswith(
        "L3-d64-rmsnorm-swiglu-rope-postnorm-"
    )
    assert "=" not in spec_tag(c) and "/" not in spec_tag(c)
