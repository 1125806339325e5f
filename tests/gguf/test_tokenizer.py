"""A GGUF file's tokenizer (`lmcore.gguf.tokenizer`): `tokenizer.ggml.*` as llama.cpp's converter
writes them for a byte-level BPE, rebuilt into a tokenizer that tokenizes as the original, with
its stop tokens and chat template, and written back as llama.cpp wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmcore.errors import ConversionError
from lmcore.gguf.tokenizer import from_gguf_metadata, to_gguf_metadata
from tests.helpers.gguf import CHATML, CORPUS, byte_level_bpe, ggml_tokenizer, needs_gguf

gguf = needs_gguf()


def test_the_gguf_tokenizer_tokenizes_as_the_original(tmp_path: Path) -> None:
    tok = byte_level_bpe()
    meta = ggml_tokenizer(tok)
    saved = from_gguf_metadata(meta, "t.gguf")
    assert saved is not None
    rebuilt = saved.tokenizer()
    text = "\n".join(CORPUS) + " 2024-06-01 x1y22z333 ÆØÅ   \n\t!"
    for line in [*CORPUS, text]:
        assert rebuilt.encode(line).ids == tok.encode(line).ids, line
        assert rebuilt.decode(tok.encode(line).ids) == tok.decode(tok.encode(line).ids)
    assert saved.eos_token_id == tok.token_to_id("<|im_end|>")
    assert set(saved.stop_token_ids) == {
        tok.token_to_id("<|im_end|>"),
        tok.token_to_id("<|endoftext|>"),
    }
    assert saved.chat_template == CHATML
    back = to_gguf_metadata(saved, 300)  # and the way back gives what llama.cpp wrote
    for key in ("tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert back[key] == meta[key]
    with pytest.raises(ConversionError, match=r"tokenizer\.ggml\.pre='mystery'"):
        from_gguf_metadata({**meta, "tokenizer.ggml.pre": "mystery"}, "t.gguf")
