"""A GGUF file's tokenizer (`lmcore.gguf.tokenizer`): `tokenizer.ggml.*` as llama.cpp's converter
writes them for a byte-level BPE, rebuilt into a tokenizer that tokenizes as the original, with
its stop tokens and chat template, and written back as llama.cpp wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmcore.errors import ConversionError
from lmcore.gguf.tokenizer import from_gguf_metadata, to_gguf_metadata
from tests.helpers.errors import raises_naming
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


def _meta(**changes: Any) -> dict[str, Any]:
    """The tiny tokenizer's `tokenizer.ggml.*`, keys (dots as __) replaced; None drops one."""
    meta = ggml_tokenizer(byte_level_bpe())
    for key, value in changes.items():
        full = "tokenizer." + key.replace("__", ".")
        if value is None:
            meta.pop(full)
        else:
            meta[full] = value(meta) if callable(value) else value
    return meta


def _tokens(edit: Any) -> Any:
    def edited(meta: dict[str, Any]) -> list[str]:
        tokens = list(meta["tokenizer.ggml.tokens"])
        edit(tokens)
        return tokens

    return edited


IGNORE_TOKENIZER = "--ignore-field tokenizer.ggml.model"
REFUSED = {  # P-gguf-*: what the file says -> the facts the error names
    "tok-merge": (
        {"ggml__merges": lambda m: [*m["tokenizer.ggml.merges"], "zzzq qqqz"]},
        ("tokenizer.ggml.merges[41]", "'zzzq qqqz'", "'zzzq'", "not in tokenizer.ggml.tokens",
         IGNORE_TOKENIZER),
    ),
    "tok-dup": (
        {"ggml__tokens": _tokens(lambda t: t.__setitem__(-1, t[-2]))},
        ("tokenizer.ggml.tokens", "twice (ids 298 and 299)", IGNORE_TOKENIZER),
    ),
    "tok-pre": (
        {"ggml__pre": ["smollm", "x"]},
        ("tokenizer.ggml.pre is a list (['smollm', 'x'])", "not a string", "smollm, starcoder"),
    ),
    "tok-bos-a": (
        {"ggml__bos_token_id": "<|im_start|>", "ggml__eos_token_id": "<|im_end|>"},
        ("tokenizer.ggml.bos_token_id is a string ('<|im_start|>')",
         "tokenizer.ggml.eos_token_id is a string ('<|im_end|>')", "[0, 300)",
         "--ignore-field tokenizer.ggml.bos_token_id --ignore-field tokenizer.ggml.eos_token_id"),
    ),
    "bos-out": (
        {"ggml__bos_token_id": 5000, "ggml__eos_token_id": 7000},
        ("bos_token_id is an int (5000)", "eos_token_id is an int (7000)", "[0, 300)"),
    ),
    "bos-neg": (
        {"ggml__bos_token_id": -1, "ggml__eos_token_id": -2},
        ("bos_token_id is an int (-1)", "eos_token_id is an int (-2)", "[0, 300)"),
    ),
    "tok-more": (
        {"ggml__tokens": lambda m: [*m["tokenizer.ggml.tokens"], *(f"x{i}" for i in range(50))],
         "ggml__token_type": lambda m: [*m["tokenizer.ggml.token_type"], *[1] * 50]},
        ("tokenizer.ggml.tokens lists 350 tokens", "vocabulary holds 300", IGNORE_TOKENIZER),
    ),
    "tok-nomerge": (
        {"ggml__merges": None},
        ("tokenizer.ggml.merges is missing", "byte-level BPE", IGNORE_TOKENIZER),
    ),
    "tok-empty-merges": ({"ggml__merges": []}, ("tokenizer.ggml.merges is empty",)),
    "tmpl-num": (
        {"chat_template": 42},
        ("tokenizer.chat_template is an int (42)", "not a string",
         "--ignore-field tokenizer.chat_template"),
    ),
    "tmpl-arr": (
        {"chat_template": ["a", "b"]},
        ("tokenizer.chat_template is a list (['a', 'b'])", "not a string"),
    ),
    "add-bos-not-bool": (
        {"ggml__add_bos_token": "yes"}, ("tokenizer.ggml.add_bos_token is a string ('yes')",),
    ),
    "add-bos-without-bos": (
        {"ggml__add_bos_token": True, "ggml__bos_token_id": None},
        ("add_bos_token is true", "no tokenizer.ggml.bos_token_id"),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("changes", "facts"), REFUSED.values(), ids=REFUSED.keys())
def test_a_tokenizer_lmcore_cannot_rebuild_exactly_is_refused_at_convert_time(
    changes: dict[str, Any], facts: tuple[str, ...]
) -> None:
    with raises_naming(ConversionError, "t.gguf", *facts):
        from_gguf_metadata(_meta(**changes), "t.gguf", vocab_size=300)


def test_an_ignored_key_is_left_out() -> None:
    saved = from_gguf_metadata(
        _meta(ggml__bos_token_id=-1, chat_template=42),
        "t.gguf",
        ignore=["tokenizer.ggml.bos_token_id", "tokenizer.chat_template"],
    )
    assert saved is not None and saved.bos_token_id is None and saved.chat_template is None


@pytest.mark.parametrize("bos", ["$A", "B O S", "<s>"])  # P-gguf-tok-bos-dollar, -bos-b
def test_a_bos_token_of_any_spelling_is_prepended_as_one_token(bos: str) -> None:
    # token 1 (<|im_start|>, the BOS id) respelled: a template string would read '$A' as the
    # sequence (giving 'Hi' 'Hi') and 'B O S' as three tokens
    saved = from_gguf_metadata(
        _meta(ggml__tokens=_tokens(lambda t: t.__setitem__(1, bos)), ggml__add_bos_token=True),
        "t.gguf",
    )
    assert saved is not None and saved.add_bos_token and saved.bos_token_id == 1
    tok = saved.tokenizer()
    plain = tok.encode("Hi there", add_special_tokens=False)
    encoded = tok.encode("Hi there")
    assert encoded.ids == [1, *plain.ids] and encoded.tokens[0] == bos
    assert tok.encode("Hi", "there").ids[0] == 1
