"""Writing an lmcore model as GGUF (`lmcore.gguf.writing`): what a llama.cpp Llama cannot hold
is refused before a byte is written (every architecture written: tests/gguf/test_architectures_families.py; read
back by gguf and by transformers' own GGUF loader)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmcore
from lmcore.errors import ConversionError
from lmcore.gguf import save_gguf
from tests.helpers.gguf import needs_gguf

gguf = needs_gguf()


def test_save_gguf_refuses_what_llama_cannot_hold(tmp_path: Path) -> None:
    model = lmcore.build_model(
        "vocab_size=64,context_length=16,d_model=32,num_layers=1,num_heads=2,pos=nope"
    )
    with pytest.raises(ConversionError, match="nope"):
        save_gguf(model, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    with pytest.raises(ConversionError, match=r"--type 'q2'"):
        save_gguf(lmcore.build_model("cs336-tiny"), tmp_path / "m.gguf", type="q2")
