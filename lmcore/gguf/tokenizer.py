"""A GGUF file's tokenizer (`tokenizer.ggml.*`) as a `tokenizers` tokenizer.json, and back.

GGUF keeps no tokenizer.json: it stores the vocabulary (`tokens`, with a `token_type` each), the
merges, the special token ids and the name of the pre-tokenizer (`tokenizer.ggml.pre`), whose
regular expressions live in llama.cpp's source. Byte-level BPE (`tokenizer.ggml.model` "gpt2")
is rebuilt here as llama.cpp runs it: a BPE model over the GGUF vocabulary and merges, the
splits `PRE_TOKENIZERS` names for `pre` followed by GPT-2's byte-level mapping, the byte-level
decoder, control tokens (type 3) as special added tokens and user-defined ones (type 4) as
added tokens. A `pre` this table does not know is refused, naming it, since another split
would tokenise some text differently from the original.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from lmcore.errors import ConversionError, one_of
from lmcore.tokenizer import SavedTokenizer

__all__ = ["PRE_TOKENIZERS", "from_gguf_metadata", "to_gguf_metadata"]

# llama.cpp's token types
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

_GPT2: Final = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3: Final = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2: Final = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> the regular expressions llama.cpp splits text by, in order (llama-vocab.cpp)
PRE_TOKENIZERS: Final[Mapping[str, tuple[str, ...]]] = {
    "default": (_GPT2,),
    "gpt-2": (_GPT2,),
    "gpt2": (_GPT2,),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        (r"\p{N}", _GPT2),
    ),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), (_LLAMA3,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), (_QWEN2,)),
}
_KEY: Final = "tokenizer.ggml."


def from_gguf_metadata(
    metadata: Mapping[str, Any], where: object, *, ignore: Iterable[str] = ()
) -> SavedTokenizer | None:
    """The tokenizer a GGUF file's metadata describes; None when it has none (or when its
    `tokenizer.ggml.model` is ignored). `ConversionError` naming the field lmcore cannot
    rebuild exactly."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    kind = metadata.get(_KEY + "model")
    if kind is None or _KEY + "model" in set(ignore):
        return None
    if kind != "gpt2":
        raise ConversionError(
            f"{where}: {_KEY}model={kind!r}: lmcore rebuilds byte-level BPE tokenizers ('gpt2') "
            f"only; pass --ignore-field {_KEY}model to convert the model without its tokenizer"
        )
    pre = metadata.get(_KEY + "pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConversionError(
            f"{where}: {_KEY}pre={pre!r} names a pre-tokenizer lmcore does not know (it knows "
            f"{one_of(PRE_TOKENIZERS)}); pass --ignore-field {_KEY}model to convert the model "
            "without its tokenizer"
        )
    tokens, types = metadata.get(_KEY + "tokens"), metadata.get(_KEY + "token_type")
    merges = metadata.get(_KEY + "merges", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ConversionError(f"{where}: {_KEY}tokens is missing or not a list of strings")
    if types is None:
        types = [NORMAL] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens):
        raise ConversionError(f"{where}: {_KEY}token_type does not give one type per token")
    pairs = []
    for m in merges:
        left, sep, right = m.partition(" ") if isinstance(m, str) else ("", "", "")
        if not sep:
            raise ConversionError(f"{where}: {_KEY}merges holds {m!r}, not 'left right'")
        pairs.append((left, right))
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}  # the first id of a duplicate
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False)
               for t, k in zip(tokens, types, strict=True) if k == CONTROL]  # fmt: skip
    user = [AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED]  # fmt: skip
    tok.add_special_tokens(control)
    tok.add_tokens(user)

    def token_id(name: str) -> int | None:
        value = metadata.get(_KEY + name)
        return value if isinstance(value, int) and 0 <= value < len(tokens) else None

    stops = [i for i in (token_id(n) for n in ("eos_token_id", "eot_token_id", "eom_token_id"))
             if i is not None]  # fmt: skip
    saved = SavedTokenizer(
        json=tok.to_str(),
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token_id=token_id("bos_token_id"),
        eos_token_id=token_id("eos_token_id"),
        add_bos_token=metadata.get(_KEY + "add_bos_token") is True,
    )
    if saved.add_bos_token and saved.bos_token_id is not None:
        _prepend_bos(tok, tokens[saved.bos_token_id], saved.bos_token_id)
        saved = SavedTokenizer(**{**saved.__dict__, "json": tok.to_str()})
    found = (*stops, *saved.default_stops(tok))
    return SavedTokenizer(**{**saved.__dict__, "stop_token_ids": tuple(dict.fromkeys(found))})


def _prepend_bos(tok: Any, bos: str, bos_id: int) -> None:
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )


def to_gguf_metadata(saved: SavedTokenizer, vocab_size: int) -> dict[str, Any]:
    """`tokenizer.ggml.*` (and `tokenizer.chat_template`) for a byte-level BPE tokenizer.json,
    padded with unused tokens to the model's `vocab_size`; `ConversionError` for another kind."""
    config = json.loads(saved.json)
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        raise ConversionError(
            f"the model's tokenizer is {model.get('type')!r}, not byte-level BPE: GGUF's 'gpt2' "
            "tokenizer cannot hold it"
        )
    pre = _pre_name(config.get("pre_tokenizer"))
    vocab: dict[str, int] = model["vocab"]
    added = {t["id"]: t for t in config.get("added_tokens", [])}
    size = max([vocab_size, *(i + 1 for i in vocab.values()), *(i + 1 for i in added)])
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for i, t in added.items():
        tokens[i], types[i] = t["content"], CONTROL if t.get("special") else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out: dict[str, Any] = {
        _KEY + "model": "gpt2",
        _KEY + "pre": pre,
        _KEY + "tokens": tokens,
        _KEY + "token_type": types,
        _KEY + "merges": merges,
        _KEY + "add_bos_token": saved.add_bos_token,
    }
    if saved.bos_token_id is not None:
        out[_KEY + "bos_token_id"] = saved.bos_token_id
    eos = (
        saved.eos_token_id
        if saved.eos_token_id is not None
        else next(iter(saved.stop_token_ids), None)
    )
    if eos is not None:
        out[_KEY + "eos_token_id"] = eos
    ends = [i for i in saved.stop_token_ids if i != eos]
    if ends:
        out[_KEY + "eot_token_id"] = ends[0]
    if saved.chat_template is not None:
        out["tokenizer.chat_template"] = saved.chat_template
    return out


def _pre_name(pre: Any) -> str:
    """The `tokenizer.ggml.pre` whose splits a tokenizer.json's pre-tokenizer makes."""
    steps = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    kinds = [s.get("type") for s in steps]
    splits = [s.get("pattern", {}).get("Regex") for s in steps if s.get("type") == "Split"]
    last = steps[-1] if steps else {}
    byte_level = last.get("type") == "ByteLevel" and not last.get("add_prefix_space")
    if byte_level and kinds == ["ByteLevel"] and last.get("use_regex", True):
        return "gpt-2"
    if (
        byte_level
        and last.get("use_regex", True)
        and (
            (kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"))
            or (kinds == ["Split", "ByteLevel"] and splits == [r"\p{N}"])
        )
    ):
        return "smollm"
    if byte_level and not last.get("use_regex", True) and len(splits) == len(kinds) - 1:
        for name, regexes in PRE_TOKENIZERS.items():
            if tuple(splits) == regexes:
                return name
    raise ConversionError(
        f"the model's tokenizer splits text with {json.dumps(pre)[:200]}, which no GGUF "
        f"pre-tokenizer lmcore knows reproduces ({one_of(sorted(set(PRE_TOKENIZERS)))})"
    )
