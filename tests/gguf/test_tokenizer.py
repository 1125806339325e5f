"""A GGUF file's tokenizer (`lmcore.gguf.tokenizer`): `tokenizer.ggml.*` as llama.cpp's converter
writes them for a byte-level BPE or a SentencePiece vocabulary, rebuilt into a tokenizer that tokenizes as the original, with
its stop tokens and chat template, and written back as llama.cpp wrote it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmcore.errors import ConversionError
from lmcore.gguf.tokenizer import from_gguf_metadata, to_gguf_metadata
from tests.helpers.errors import raises_naming
from tests.helpers.gguf import (
    CHATML,
    CORPUS,
    byte_level_bpe,
    ggml_sentencepiece,
    ggml_tokenizer,
    needs_gguf,
    sentencepiece_bpe,
)

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


# ---------------------------------------------------------------------------------------------
# SentencePiece (`tokenizer.ggml.model` "llama"): Llama 2, Mistral, Gemma, Phi-3's vocabularies
# ---------------------------------------------------------------------------------------------

SPM_LINES = [*CORPUS, "\n".join(CORPUS) + " 2024-06-01 x1y22z333 ÆØÅ   \n\t! 漢字",
             "  two spaces first", "</s>after a special token<s> x", "Hello"]  # fmt: skip


@pytest.mark.parametrize("prefix", [True, False], ids=["space-prefix", "no-prefix"])
def test_a_sentencepiece_gguf_tokenizes_as_the_original(prefix: bool) -> None:
    tok = sentencepiece_bpe(prefix)
    meta = ggml_sentencepiece(tok, prefix)
    saved = from_gguf_metadata(meta, "t.gguf")
    assert saved is not None and saved.add_bos_token and saved.bos_token_id == 1
    rebuilt = saved.tokenizer()
    for line in SPM_LINES:  # merged by score, unknown characters as their bytes (漢字)
        ids = tok.encode(line).ids
        assert rebuilt.encode(line).ids == [1, *ids], line
        assert rebuilt.decode(ids) == tok.decode(ids), line
    assert "<0xE6>" in tok.encode("漢").tokens  # byte fallback is exercised
    back = to_gguf_metadata(saved, len(meta["tokenizer.ggml.tokens"]))  # and written back
    for key in ("model", "tokens", "token_type", "add_space_prefix", "bos_token_id"):
        assert back[f"tokenizer.ggml.{key}"] == meta[f"tokenizer.ggml.{key}"], key
    again = from_gguf_metadata(back, "t.gguf")
    assert again is not None
    for line in SPM_LINES:
        assert again.tokenizer().encode(line).ids == rebuilt.encode(line).ids, line


def test_a_sentencepiece_gguf_file_round_trips_and_transformers_reads_it(tmp_path: Path) -> None:
    """The file's tokenizer as lmcore and transformers' GGUF tokenizer rebuild it, and lmcore's
    written file read by both. transformers' rebuild differs from llama.cpp (and the original)
    only where a space is prepended: before text that starts with a space, and after a special
    token (its Metaspace prepends once, llama.cpp's add_space_prefix after every special)."""
    import transformers

    from lmcore.gguf import load_gguf, save_gguf
    from tests.helpers.gguf import hf_llama, write_llama

    tok = sentencepiece_bpe()
    meta = ggml_sentencepiece(tok)
    write_llama(tmp_path / "m.gguf", hf_llama(vocab=len(meta["tokenizer.ggml.tokens"])),
                tokenizer=meta)  # fmt: skip
    model = load_gguf(tmp_path / "m.gguf")
    assert model.tokenizer is not None
    ours = model.tokenizer.tokenizer()
    save_gguf(model, tmp_path / "w.gguf")
    written = load_gguf(tmp_path / "w.gguf").tokenizer
    assert written is not None
    for name in ("m.gguf", "w.gguf"):
        theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=name)
        for line in SPM_LINES:
            ids = ours.encode(line).ids
            assert ids == [1, *tok.encode(line).ids]
            assert written.tokenizer().encode(line).ids == ids
            if not line.startswith((" ", "</s>")):
                assert theirs(line)["input_ids"] == ids, (name, line)


SPM_REFUSED = {
    "scores-missing": ({"ggml__scores": None}, ("tokenizer.ggml.scores is missing",
                                                "one number per token")),
    "scores-short": ({"ggml__scores": lambda m: m["tokenizer.ggml.scores"][:-1]},
                     ("tokenizer.ggml.scores is a list",)),
    "prefix-type": ({"ggml__add_space_prefix": "yes"},
                    ("tokenizer.ggml.add_space_prefix is a string ('yes')", "not a bool")),
    "charsmap": ({"ggml__precompiled_charsmap": [1, 2, 3]},
                 ("tokenizer.ggml.precompiled_charsmap", "normalization")),
    "unigram": ({"ggml__model": "t5"}, ("tokenizer.ggml.model='t5'", "'gpt2'", "'llama'")),
}  # fmt: skip


@pytest.mark.parametrize(("changes", "facts"), SPM_REFUSED.values(), ids=SPM_REFUSED.keys())
def test_a_sentencepiece_tokenizer_lmcore_cannot_rebuild_is_refused(
    changes: dict[str, Any], facts: tuple[str, ...]
) -> None:
    meta = ggml_sentencepiece(sentencepiece_bpe())
    for key, value in changes.items():
        full = "tokenizer." + key.replace("__", ".")
        if value is None:
            meta.pop(full)
        else:
            meta[full] = value(meta) if callable(value) else value
    with raises_naming(ConversionError, "t.gguf", *facts, "--ignore-field tokenizer.ggml.model"):
        from_gguf_metadata(meta, "t.gguf")
