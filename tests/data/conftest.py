"""Fixtures of the token-data tests: a small tokenizer and a corpus for both splits."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from lmcore.data import train_tokenizer
from tests.helpers.runs import SAMPLE, write


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return train_tokenizer(iter([SAMPLE] * 20), 400)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A directory of documents long enough for both splits at the default block size."""
    root = tmp_path / "corpus"
    for i in range(12):
        write(root / f"doc{i:02}.txt", f"Document {i}.\n" + SAMPLE * (1 + i % 3))
    return root
