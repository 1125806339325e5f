"""Bits per byte: nats over the bytes, in bits; the byte counts are lmcore.data.bytecount's."""

from __future__ import annotations

import math

import pytest

from lmcore.data import bytecount
from lmcore.eval import bpb
from lmcore.eval.bpb import bits_per_byte


def test_bits_per_byte_is_nats_over_bytes_in_bits() -> None:
    assert bits_per_byte(math.log(2) * 10, 5) == pytest.approx(2.0)
    assert math.isnan(bits_per_byte(1.0, 0))
    assert bpb.token_bytes is bytecount.token_bytes  # evaluation counts bytes as training does
