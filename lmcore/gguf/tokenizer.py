"""A GGUF file's tokenizer (`tokenizer.ggml.*`) as a `tokenizers` tokenizer.json, and back.

GGUF keeps no tokenizer.json: it stores the vocabulary (`tokens`, with a `token_type` each), the
merges or the scores, the special token ids and the name of the pre-tokenizer
(`tokenizer.ggml.pre`), whose regular expressions live in llama.cpp's source. Both models
llama.cpp's users hold are rebuilt as llama.cpp runs them:

  - byte-level BPE (`tokenizer.ggml.model` "gpt2"): a BPE model over the GGUF vocabulary and
    merges, the splits `PRE_TOKENIZERS` names for `pre` followed by GPT-2's byte-level mapping,
    the byte-level decoder. A `pre` this table does not know is refused, naming it, since
    another split would tokenise some text differently from the original.
  - SentencePiece (`tokenizer.ggml.model` "llama": Llama 2, Mistral, Gemma, Phi-3): spaces as
    "▁" and one before the text and after each special token (`add_space_prefix`), pairs merged
    by the score of the token they make (`spm_merges`; the file's merges when it has them),
    characters no token holds as their byte tokens (<0xXX>), BOS prepended by default.

Control tokens (type 3) become special added tokens and user-defined ones (type 4) added tokens.
Every key is checked when the file is converted, not when the tokenizer is first used: its type,
the special ids against the vocabulary, the vocabulary against the model's (no more tokens than
embeddings, none listed twice), each merge against the vocabulary, merges present at all for a
byte-level BPE, one score per token for a SentencePiece one. A BOS prepended by `add_bos_token`
is written as tokenizer.json's structure, so any spelling works, and checked by encoding.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from lmcore.errors import ConversionError, one_of
from lmcore.tokenizer import SavedTokenizer

__all__ = ["PRE_TOKENIZERS", "from_gguf_metadata", "to_gguf_metadata"]

# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

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


def _kind(value: object) -> str:
    """A metadata value's type as a sentence says it: "an int (42)", "a list (['a', 'b'])"."""
    name = {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "a list"}
    shown = repr(value)
    clipped = shown[:60] + ("..." if len(shown) > 60 else "")
    return f"{name.get(type(value), type(value).__name__)} ({clipped})"


def _refuse(where: object, problem: str, key: str | None = None) -> ConversionError:
    """The error for a tokenizer lmcore cannot rebuild exactly, with the way out: convert the
    model without its tokenizer (or without the one key, when it stands alone)."""
    fix = (
        f"pass --ignore-field {key} to convert without it"
        if key is not None
        else f"pass --ignore-field {_KEY}model to convert the model without its tokenizer"
    )
    return ConversionError(f"{where}: {problem}; {fix}")


def _strings(value: Any, key: str, where: object) -> list[str]:
    if not isinstance(value, list):
        said = "missing" if value is None else _kind(value)
        raise _refuse(where, f"{key} is {said}, not a list of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _refuse(where, f"{key}[{i}] is {_kind(item)}, not a string")
    return value


def _vocabulary(tokens: list[str], vocab_size: int | None, where: object) -> dict[str, int]:
    """Token -> id, refusing a token listed twice (BPE needs one id per token, and llama.cpp
    refuses such a file too) and more tokens than the model has embeddings."""
    if vocab_size is not None and len(tokens) > vocab_size:
        raise _refuse(
            where,
            f"{_KEY}tokens lists {len(tokens):,} tokens, but the model's vocabulary holds "
            f"{vocab_size:,} (its vocab_size, token_embd.weight's rows): ids {vocab_size:,} and "
            "above would have no embedding",
        )
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise _refuse(
                where, f"{_KEY}tokens lists {t!r} twice (ids {vocab[t]} and {i}); a vocabulary "
                "lists each token once",
            )
        vocab[t] = i
    return vocab


def _merges(
    value: Any, vocab: Mapping[str, int], types: list[int], where: object
) -> list[tuple[str, str]]:
    """The merges as pairs, each naming two tokens of the vocabulary that merge into a third
    (what `tokenizers`' BPE requires; refused by position otherwise). A byte-level BPE without
    merges never reaches its longer tokens: refused."""
    key = _KEY + "merges"
    if value is None or value == []:
        normal = (t for t, k in zip(vocab, types, strict=True) if k == NORMAL and len(t) > 1)
        longer = next(normal, None)
        if longer is not None:
            raise _refuse(
                where,
                f"{key} is {'missing' if value is None else 'empty'}: a byte-level BPE ('gpt2') "
                f"without merges never produces its longer tokens (such as {longer!r}), so "
                "it would tokenise text otherwise than the model was trained on",
            )
        return []
    pairs = []
    for i, m in enumerate(_strings(value, key, where)):
        left, sep, right = m.partition(" ")
        if not sep or not left or not right:
            raise _refuse(where, f"{key}[{i}] is {m!r}, not 'left right' (two tokens, one space)")
        for part in (left, right, left + right):
            if part not in vocab:
                raise _refuse(
                    where,
                    f"{key}[{i}] is {m!r}, which names {part!r}, a token that is not in "
                    f"{_KEY}tokens (a merge joins two tokens of the vocabulary into a third)",
                )
        pairs.append((left, right))
    return pairs


SPACE: Final = "\u2581"  # SentencePiece's spelling of a space ("▁")
_BYTE_TOKEN: Final = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _scores(value: Any, count: int, where: object) -> list[float]:
    key = _KEY + "scores"
    if (
        not isinstance(value, list)
        or len(value) != count
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        said = "missing" if value is None else _kind(value)
        raise _refuse(
            where,
            f"{key} is {said}, not one number per token (SentencePiece merges the pair whose "
            "token scores highest)",
        )
    return [float(v) for v in value]


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The BPE merges llama.cpp's SentencePiece tokenizer makes: every split of a token into
    two tokens of the vocabulary, the token with the higher score merged first (then the longer
    left part, then the longer right; within one token, by the parts' ids), as transformers
    rebuilds them from a GGUF file."""
    vocab = {t: i for i, t in enumerate(tokens)}
    found = []
    for token, score in zip(tokens, scores, strict=True):
        local = [
            (token[:j], token[j:]) for j in range(1, len(token))
            if token[:j] in vocab and token[j:] in vocab
        ]  # fmt: skip
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found += [(score, left, right) for left, right in local]
    found.sort(key=lambda m: (-m[0], -len(m[1]), -len(m[2])))  # stable: ties keep their order
    return [(left, right) for _, left, right in found]


def _sentencepiece(
    get: Any, tokens: list[str], vocab: dict[str, int], types: list[int], where: object
) -> Any:
    """A SentencePiece vocabulary (`tokenizer.ggml.model` "llama") as llama.cpp runs it: a
    space before the text and after each special token (`add_space_prefix`, default true),
    spaces spelled "▁", pairs merged by score (or by `tokenizer.ggml.merges`, when the file has
    them), a character no token holds spelled as its UTF-8 byte tokens (<0xXX>, type 6), else
    the unknown token."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    for key in ("precompiled_charsmap", "remove_extra_whitespaces"):
        value = get(_KEY + key)
        if value not in (None, False, []):
            raise _refuse(
                where,
                f"{_KEY}{key} asks for SentencePiece's text normalization, which lmcore does not "
                "rebuild",
            )
    prefix = get(_KEY + "add_space_prefix")
    prefix = True if prefix is None else prefix
    if not isinstance(prefix, bool):
        raise _refuse(where, f"{_KEY}add_space_prefix is {_kind(prefix)}, not a bool")
    merges = get(_KEY + "merges")
    if merges:
        pairs = _merges(merges, vocab, types, where)
    else:
        pairs = spm_merges(tokens, _scores(get(_KEY + "scores"), len(tokens), where))
    unknown = get(_KEY + "unknown_token_id")
    if not (isinstance(unknown, int) and 0 <= unknown < len(tokens)):
        unknown = next((i for i, k in enumerate(types) if k == UNKNOWN), None)
    fallback = any(k == BYTE for k in types)
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=pairs,
            unk_token=None if unknown is None else tokens[unknown],
            byte_fallback=fallback,
            fuse_unk=True,
            ignore_merges=False,
        )
    )
    spaces = [normalizers.Replace(" ", SPACE)]
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), *spaces] if prefix
                                          else spaces)  # fmt: skip
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tok


def from_gguf_metadata(
    metadata: Mapping[str, Any],
    where: object,
    *,
    ignore: Iterable[str] = (),
    vocab_size: int | None = None,
) -> SavedTokenizer | None:
    """The tokenizer a GGUF file's metadata describes; None when it has none (or when its
    `tokenizer.ggml.model` is ignored). Every key is checked, for its type and against the
    others, before anything is built (`vocab_size`: the model's, which the tokens may not
    exceed); `ConversionError` naming the key, the value and the fix. A key in `ignore` is
    treated as absent."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ignored = set(ignore)

    def get(key: str) -> Any:
        return None if key in ignored else metadata.get(key)

    kind = get(_KEY + "model")
    if kind is None:
        return None
    if kind not in ("gpt2", "llama"):
        raise _refuse(
            where,
            f"{_KEY}model={kind!r}: lmcore rebuilds byte-level BPE ('gpt2') and SentencePiece "
            "('llama') tokenizers only",
        )
    if kind == "gpt2":
        pre = get(_KEY + "pre")
        pre = "default" if pre is None else pre
        if not isinstance(pre, str):
            raise _refuse(
                where,
                f"{_KEY}pre is {_kind(pre)}, not a string naming a pre-tokenizer (lmcore knows "
                f"{one_of(PRE_TOKENIZERS)})",
            )
        if pre not in PRE_TOKENIZERS:
            raise _refuse(
                where,
                f"{_KEY}pre={pre!r} names a pre-tokenizer lmcore does not know (it knows "
                f"{one_of(PRE_TOKENIZERS)})",
            )
    tokens = _strings(get(_KEY + "tokens"), _KEY + "tokens", where)
    vocab = _vocabulary(tokens, vocab_size, where)
    types = get(_KEY + "token_type")
    types = [NORMAL] * len(tokens) if types is None else types
    if (
        not isinstance(types, list)
        or len(types) != len(tokens)
        or not all(isinstance(k, int) and not isinstance(k, bool) for k in types)
    ):
        raise _refuse(where, f"{_KEY}token_type does not give one integer type per token")
    if kind == "gpt2":
        pairs = _merges(get(_KEY + "merges"), vocab, types, where)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()
    else:
        tok = _sentencepiece(get, tokens, vocab, types, where)

    ids: dict[str, int | None] = {}
    bad = []  # every id key that is not an id, named in one line
    for name in ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id",
                 "unknown_token_id", "padding_token_id"):  # fmt: skip
        value = get(_KEY + name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(tokens)
        ):
            bad.append(_KEY + name)
            ids[name] = None
            continue
        ids[name] = value
    if bad:
        said = ", ".join(f"{k} is {_kind(metadata[k])}" for k in bad)
        raise ConversionError(
            f"{where}: {said}: a token id is an integer in [0, {len(tokens)}) (the "
            f"{len(tokens)} tokens of {_KEY}tokens); pass "
            + " ".join(f"--ignore-field {k}" for k in bad)
            + " to convert without "
            + ("it" if len(bad) == 1 else "them")
        )
    add_bos = get(_KEY + "add_bos_token")
    if add_bos is None and kind == "llama":
        add_bos = ids["bos_token_id"] is not None  # llama.cpp's default for SentencePiece
    if add_bos is not None and not isinstance(add_bos, bool):
        said = f"{_KEY}add_bos_token is {_kind(add_bos)}, not a bool"
        raise _refuse(where, said, _KEY + "add_bos_token")
    if add_bos and ids["bos_token_id"] is None:
        raise _refuse(
            where, f"{_KEY}add_bos_token is true, but no {_KEY}bos_token_id says which token to "
            "prepend", _KEY + "add_bos_token",
        )
    template = get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise _refuse(
            where,
            f"tokenizer.chat_template is {_kind(template)}, not a string (a Jinja template)",
            "tokenizer.chat_template",
        )
    control = [AddedToken(t, special=True, normalized=False)
               for t, k in zip(tokens, types, strict=True) if k == CONTROL]  # fmt: skip
    user = [AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED]  # fmt: skip
    tok.add_special_tokens(control)
    tok.add_tokens(user)
    bos = ids["bos_token_id"]
    if add_bos and bos is not None:
        tok = _prepend_bos(tok, tokens[bos], bos, where)
    saved = SavedTokenizer(
        json=tok.to_str(),
        chat_template=template,
        bos_token_id=bos,
        eos_token_id=ids["eos_token_id"],
        add_bos_token=add_bos is True,
    )
    stops = [i for n, i in ids.items() if n in ("eos_token_id", "eot_token_id", "eom_token_id")
             and i is not None]  # fmt: skip
    found = (*stops, *saved.default_stops(tok))
    return SavedTokenizer(**{**saved.__dict__, "stop_token_ids": tuple(dict.fromkeys(found))})


def _prepend_bos(tok: Any, bos: str, bos_id: int, where: object) -> Any:
    """`tok` prepending token `bos_id` to every encoding. The post-processor is written as
    tokenizer.json's structure, not as a template string, which would read a BOS spelled '$A'
    as the sequence and one with spaces ('B O S') as three tokens; the result is checked by
    encoding."""
    from tokenizers import Tokenizer

    def piece(kind: str, name: str, type_id: int = 0) -> dict[str, Any]:
        return {kind: {"id": name, "type_id": type_id}}

    config = json.loads(tok.to_str())
    config["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [piece("SpecialToken", bos), piece("Sequence", "A")],
        "pair": [piece("SpecialToken", bos), piece("Sequence", "A"),
                 piece("SpecialToken", bos, 1), piece("Sequence", "B", 1)],  # fmt: skip
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    out = Tokenizer.from_str(json.dumps(config))
    sample = "Hello world"
    plain = out.encode(sample, add_special_tokens=False).ids
    if out.encode(sample).ids != [bos_id, *plain]:
        raise _refuse(
            where,
            f"the BOS token {bos!r} (id {bos_id}) is not prepended as the one token it is",
            _KEY + "add_bos_token",
        )
    return out


def to_gguf_metadata(saved: SavedTokenizer, vocab_size: int) -> dict[str, Any]:
    """`tokenizer.ggml.*` (and `tokenizer.chat_template`) for a byte-level BPE tokenizer.json,
    padded with unused tokens to the model's `vocab_size`; `ConversionError` for another kind."""
    config = json.loads(saved.json)
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        raise ConversionError(
            f"the model's tokenizer is {model.get('type')!r}, not a BPE: neither GGUF's 'gpt2' "
            "(byte-level BPE) nor its 'llama' (SentencePiece BPE) tokenizer holds it"
        )
    prefix = _sentencepiece_prefix(config)
    if prefix is not None:
        return _spm_metadata(saved, config, vocab_size, prefix)
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
    return {**out, **_special_ids(saved)}


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


def _sentencepiece_prefix(config: Mapping[str, Any]) -> bool | None:
    """Whether a tokenizer.json is llama.cpp's SentencePiece BPE (byte fallback, spaces as "▁"
    by its normalizer, no pre-tokenizer) and prepends a space; None when it is not one."""
    model = config.get("model") or {}
    norm = config.get("normalizer") or {}
    steps = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    if not model.get("byte_fallback") or config.get("pre_tokenizer") is not None:
        return None
    if steps == [{"type": "Prepend", "prepend": SPACE}, replace]:
        return True
    return False if steps == [replace] else None


def _spm_metadata(
    saved: SavedTokenizer, config: Mapping[str, Any], vocab_size: int, prefix: bool
) -> dict[str, Any]:
    """`tokenizer.ggml.*` for a SentencePiece BPE: the vocabulary with scores that merge as its
    merges do (the token a merge makes scores minus the merge's rank: `spm_merges` rebuilds the
    order), byte tokens typed 6, the unknown token 2, added ones 3 (special) or 4."""
    model = config["model"]
    vocab: dict[str, int] = model["vocab"]
    added = {t["id"]: t for t in config.get("added_tokens", [])}
    size = max([vocab_size, *(i + 1 for i in vocab.values()), *(i + 1 for i in added)])
    tokens = [f"[PAD{i}]" for i in range(size)]
    types, scores = [UNUSED] * size, [-1e9] * size
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    rank: dict[str, int] = {}
    for r, m in enumerate(merges):
        rank.setdefault(m.replace(" ", ""), r)
    for text, i in vocab.items():
        tokens[i], types[i] = text, BYTE if _BYTE_TOKEN.fullmatch(text) else NORMAL
        scores[i] = 0.0 if types[i] == BYTE else -float(rank.get(text, len(merges) + i))
    if model.get("unk_token") in vocab:
        types[vocab[model["unk_token"]]], scores[vocab[model["unk_token"]]] = UNKNOWN, 0.0
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i], scores[i] = (CONTROL, 0.0) if t.get("special") else (USER_DEFINED, -1000.0)
    out: dict[str, Any] = {
        _KEY + "model": "llama",
        _KEY + "pre": "default",
        _KEY + "tokens": tokens,
        _KEY + "scores": scores,
        _KEY + "token_type": types,
        _KEY + "add_space_prefix": prefix,
        _KEY + "add_bos_token": saved.add_bos_token,
    }
    if model.get("unk_token") in vocab:
        out[_KEY + "unknown_token_id"] = vocab[model["unk_token"]]
    return {**out, **_special_ids(saved)}


def _special_ids(saved: SavedTokenizer) -> dict[str, Any]:
    """The BOS, EOS and end-of-turn ids and the chat template, as llama.cpp names them."""
    out: dict[str, Any] = {}
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
