"""`lmcore data prepare --chat FILE.jsonl --tokenizer-from CKPT`: conversations → token ids in the
model's own chat template, with a loss mask that trains only the assistant's tokens.

    prepare_chat("chats.jsonl", "data/chats", checkpoint="smollm2.safetensors", val_fraction=0.1)

Each line of the file is one conversation, in either of the two common forms:

    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}
    {"instruction": "...", "input": "..." (optional), "output": "..."}

(the second is the user's turn, instruction then a blank line then input, and the assistant's
output). A conversation is rendered with the checkpoint's chat template exactly as `lmcore chat`
renders a prompt (`SavedTokenizer.render_chat`, the whole conversation, no generation prompt)
and encoded with its tokenizer (`add_special_tokens=False`, as `lmcore chat` encodes). The
assistant's part of a turn is what rendering the conversation through that turn adds to
rendering it up to the turn with the generation prompt: its content and the template's end of
turn (`<|im_end|>`, so the model learns to stop). A token is trained (mask 1) when it starts
inside such a part; every other token (the system prompt, the user's turns, the template's
markup before a reply) has mask 0 and its target is `IGNORE` in training and evaluation. A
template whose earlier turns render differently once later ones follow (one that drops past
reasoning) has no such parts and is refused.

One conversation is one document: its first token's offset is written to the split's
documents file. A conversation goes to val when val holds less than `val_fraction` of the
tokens so far, else to train (the first to train), so the split depends on the file alone.
The file is read line by line and each split written as it goes: memory holds one
conversation. A line that is not a conversation (not UTF-8, not JSON, no assistant turn, a role
or content of the wrong kind, a template that fails on it) stops the command with an error
naming the line; nothing is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import numpy as np

from lmcore.atomic import atomic_path
from lmcore.data.meta import (
    DEFAULT_VAL_FRACTION,
    META_FILE,
    SPLITS,
    DataMeta,
    SourceInfo,
    SplitInfo,
    dtype_for,
    file_dtype,
)
from lmcore.data.preparing import PrepareResult, _check_out_dir
from lmcore.errors import DataError, GenerationError, LmcoreError, clip, did_you_mean, one_of
from lmcore.locks import new_directory
from lmcore.runfiles import TOKENIZER_FILE
from lmcore.version import versions

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lmcore.tokenizer import SavedTokenizer

__all__ = ["MAX_LINE_BYTES", "ROLES", "conversation", "prepare_chat", "rendered"]

ROLES: Final = ("system", "user", "assistant", "tool")
MAX_LINE_BYTES: Final = 64 << 20  # one conversation; a longer line is no conversation
MASK_DTYPE: Final = "uint8"
DOCS_DTYPE: Final = "<i8"
CHAT_DOCUMENT_RULE: Final = (
    "each line of the chat file is one conversation, rendered whole with the checkpoint's chat "
    "template and encoded without added special tokens; one conversation is one document"
)
CHAT_SPLIT_RULE: Final = (
    "a conversation goes to val when val holds less than val_fraction of the tokens so far, "
    "else to train (the first to train)"
)


def mask_file(split: str) -> str:
    return f"{split}.mask.bin"


def docs_file(split: str) -> str:
    return f"{split}.docs.bin"


def conversation(record: Any) -> list[dict[str, str]]:
    """The messages of one line's JSON: `messages`, or `instruction`/`input`/`output`. Raises
    `ValueError` saying what is wrong (the caller names the line)."""
    if not isinstance(record, dict):
        raise ValueError(
            f"is a JSON {type(record).__name__}, not an object with 'messages' (or "
            "'instruction' and 'output')"
        )
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' should be a non-empty list of {role, content} objects")
        out = []
        for i, m in enumerate(messages, 1):
            if not isinstance(m, dict):
                raise ValueError(f"message {i} is not an object with 'role' and 'content'")
            role, content = m.get("role"), m.get("content")
            if role not in ROLES:
                shown = "no 'role'" if role is None else f"role {clip(repr(role), 40, quote=False)}"
                hint = did_you_mean(role, ROLES) if isinstance(role, str) else ""
                raise ValueError(f"message {i} has {shown}{hint}; roles are {one_of(ROLES)}")
            if not isinstance(content, str):
                raise ValueError(f"message {i} ({role}) has no text 'content' (found "
                                 f"{clip(repr(content), 40, quote=False)})")  # fmt: skip
            out.append({"role": role, "content": content})
        if not any(m["role"] == "assistant" for m in out):
            raise ValueError("has no assistant message: nothing to train on")
        return out
    if "instruction" in record or "output" in record:
        fields = {k: record.get(k) for k in ("instruction", "input", "output")}
        for key in ("instruction", "output"):
            if not isinstance(fields[key], str):
                raise ValueError(f"'{key}' should be text, found {clip(repr(fields[key]), 40, quote=False)}")
        extra = fields["input"]
        if extra is not None and not isinstance(extra, str):
            raise ValueError(f"'input' should be text, found {clip(repr(extra), 40, quote=False)}")
        user = str(fields["instruction"]) + (f"\n\n{extra}" if extra else "")
        return [{"role": "user", "content": user},
                {"role": "assistant", "content": str(fields["output"])}]  # fmt: skip
    keys = ", ".join(sorted(map(str, record))[:5]) or "none"
    raise ValueError(
        f"has neither 'messages' nor 'instruction'/'output' (its keys: {clip(keys, 80, quote=False)})"
    )


def rendered(
    saved: SavedTokenizer, messages: list[dict[str, str]], tok: Tokenizer
) -> tuple[np.ndarray, np.ndarray]:
    """`(ids, mask)` of one conversation: its tokens in the template, and 1 for each token that
    starts inside an assistant's part (see the module's docstring), else 0."""
    full = saved.render_chat(messages, add_generation_prompt=False, tokenizer=tok)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = saved.render_chat(messages[:i], add_generation_prompt=True, tokenizer=tok)
        through = saved.render_chat(messages[: i + 1], add_generation_prompt=False, tokenizer=tok)
        if not (through.startswith(before) and full.startswith(through)):
            raise ValueError(
                f"the chat template renders the turns before assistant message {i + 1} "
                "differently once it follows, so its reply cannot be told from the prompt (a "
                "template that rewrites earlier turns); use a template that renders each turn "
                "the same whatever follows"
            )
        if len(through) > len(before):
            spans.append((len(before), len(through)))
    enc = tok.encode(full, add_special_tokens=False)
    ids = np.array(enc.ids, dtype=np.int64)
    starts = np.array([s for s, _ in enc.offsets], dtype=np.int64)
    mask = np.zeros(len(ids), dtype=np.uint8)
    for lo, hi in spans:
        mask[(starts >= lo) & (starts < hi)] = 1
    return ids, mask


class _ChatWriter:
    """One split's tokens, mask and document starts, appended as conversations come."""

    def __init__(self, tmp: Path, name: str, dtype: str, stack: contextlib.ExitStack):
        self.dtype = file_dtype(dtype)
        self.files: list[IO[bytes]] = []
        for file in (f"{name}.bin", mask_file(name), docs_file(name)):
            path = stack.enter_context(atomic_path(tmp / file))
            self.files.append(stack.enter_context(path.open("wb")))
        self.tokens = self.documents = self.trained = 0

    def write(self, ids: np.ndarray, mask: np.ndarray) -> None:
        tokens, masks, docs = self.files
        docs.write(np.array([self.tokens], dtype=DOCS_DTYPE).data)
        tokens.write(np.ascontiguousarray(ids, dtype=self.dtype).data)
        masks.write(np.ascontiguousarray(mask, dtype=MASK_DTYPE).data)
        self.tokens += len(ids)
        self.documents += 1
        self.trained += int(mask.sum())


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """`(number, text)` of each line that is not blank, read one at a time; `DataError` naming
    the line when it is not UTF-8 text or too long."""
    with path.open("rb") as f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise DataError(
                    f"{path}: line {number} is longer than {MAX_LINE_BYTES:,} bytes: not one "
                    "conversation of JSON lines (one conversation per line)"
                )
            nul = raw.find(b"\0")
            if nul >= 0:
                raise DataError(
                    f"{path}: line {number} holds a NUL byte at position {nul}: "
                    "not text (a binary file?); give JSON lines, one conversation per line"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{path}: line {number} is not UTF-8 text (byte {raw[e.start]:#04x} at "
                    f"position {e.start}); convert it first (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if text.strip():
                yield number, text


def _end_of_text(saved: SavedTokenizer, tok: Tokenizer, where: Path) -> tuple[int, str]:
    """The id and spelling meta.json records as the end-of-text token."""
    from lmcore.data.meta import EOT

    candidates = [saved.eos_token_id, tok.token_to_id(EOT), *saved.stop_token_ids]
    for i in candidates:
        token = None if i is None else tok.id_to_token(i)
        if token is not None and tok.token_to_id(token) == i:
            return int(i), token
    raise DataError(
        f"--tokenizer-from {where}: its tokenizer has no end-of-text token (no eos id, no "
        f"{EOT}, no stop token); lmcore's data directories record one"
    )


def prepare_chat(
    file: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    tokenizer: SavedTokenizer,
    tokenizer_from: str | os.PathLike[str],
    val_fraction: float = DEFAULT_VAL_FRACTION,
    context_length: int = 1,
    force: bool = False,
) -> PrepareResult:
    """Write `out_dir` from the JSON-lines `file` of conversations, rendered and tokenised with
    a model's `tokenizer` and its chat template (see the module's docstring), which came from
    the checkpoint `tokenizer_from` (recorded in meta.json). Each split must hold a window of
    `context_length + 1` tokens and a trained token."""
    start = time.perf_counter()
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise DataError(
            f"--val-fraction {val_fraction} is out of range: it is the share of tokens for "
            f"val.bin, strictly between 0 and 1 (e.g. {DEFAULT_VAL_FRACTION})"
        )
    if context_length < 1:
        raise DataError(f"--context-length {context_length} must be at least 1")
    path = Path(file)
    if not path.is_file():
        raise DataError(f"--chat {str(path)!r} does not exist or is not a file; give a .jsonl "
                        "file, one conversation per line")  # fmt: skip
    saved, ckpt = tokenizer, Path(os.path.abspath(tokenizer_from))
    if saved.chat_template is None:
        raise DataError(
            f"--tokenizer-from {ckpt} stores a tokenizer but no chat template; chat data is "
            "rendered with the model's own template: give a checkpoint converted from a GGUF "
            "file or a Hugging Face directory that has one"
        )
    try:
        saved.check_chat_template()
    except GenerationError as e:
        raise DataError(f"--tokenizer-from {ckpt}: {e}") from None
    out = Path(out_dir)
    _check_out_dir(out, force)
    with new_directory(
        out,
        force=force,
        what="--out",
        error=DataError,
        fix="pass --force to replace it whole, or choose another --out",
        keep_out=[("--chat", path)],
    ) as tmp:
        result = _prepare_chat(path, out, tmp, saved, ckpt, val_fraction, context_length)
    return dataclasses.replace(result, seconds=time.perf_counter() - start)


def _prepare_chat(
    path: Path,
    out: Path,
    tmp: Path,
    saved: SavedTokenizer,
    ckpt: Path,
    val_fraction: float,
    context_length: int,
) -> PrepareResult:
    tok = saved.tokenizer()
    vocab = tok.get_vocab_size()
    eot_id, eot_token = _end_of_text(saved, tok, ckpt)
    dtype = dtype_for(vocab)
    forms = {"messages": 0, "instruction": 0}
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        writers = {name: _ChatWriter(tmp, name, dtype, stack) for name in SPLITS}
        for number, text in _lines(path):
            try:
                record = json.loads(text)
            except (json.JSONDecodeError, RecursionError) as e:
                why = getattr(e, "msg", "nested too deeply")
                raise DataError(f"{path}: line {number} is not JSON ({why}); give one JSON "
                                "object per line") from None  # fmt: skip
            try:
                messages = conversation(record)
                ids, mask = rendered(saved, messages, tok)
            except ValueError as e:
                raise DataError(f"{path}: line {number} {e}") from None
            except LmcoreError as e:  # the template failed, or ran past its budget
                raise DataError(f"{path}: line {number}: {e}") from None
            forms["messages" if "messages" in record else "instruction"] += 1
            train, val = writers["train"], writers["val"]
            seen = train.tokens + val.tokens
            (val if val.tokens < val_fraction * seen else train).write(ids, mask)
        encode_seconds = time.perf_counter() - t0
        _check_splits(path, writers, context_length, val_fraction)
    digest = hashlib.sha256(saved.json.encode("utf-8")).hexdigest()
    template = hashlib.sha256((saved.chat_template or "").encode("utf-8")).hexdigest()
    meta = DataMeta(
        vocab_size=vocab,
        dtype=dtype,
        eot_id=eot_id,
        splits={  # the conversations' starts are the document index (--pack, --doc-mask)
            n: SplitInfo(f"{n}.bin", w.tokens, w.documents, docs_file(n), w.documents)
            for n, w in writers.items()
        },
        val_fraction=val_fraction,
        split_block=0,
        sources=(SourceInfo(path=os.path.abspath(path), files=1, bytes=path.stat().st_size),),
        extensions=(),
        exclude=(),
        tokenizer_from=str(ckpt),
        eot_token=eot_token,
        document_rule=CHAT_DOCUMENT_RULE,
        split_rule=CHAT_SPLIT_RULE,
        starts_rule="the document index holds each conversation's first token",
        versions=versions("tokenizers", "numpy", "jinja2"),
        masks={n: mask_file(n) for n in SPLITS},
        documents={n: docs_file(n) for n in SPLITS},
        chat={
            "checkpoint": str(ckpt),
            "tokenizer_sha256": digest,
            "chat_template_sha256": template,
            "conversations": {"messages": forms["messages"], "instruction": forms["instruction"]},
            "trained_tokens": {n: w.trained for n, w in writers.items()},
        },
    )
    saved.write(tmp / TOKENIZER_FILE)
    meta.write(tmp / META_FILE)
    return PrepareResult(out_dir=out, meta=meta, seconds=0.0, tokenizer_seconds=0.0,
                         encode_seconds=encode_seconds)  # fmt: skip


def _check_splits(
    path: Path, writers: Mapping[str, _ChatWriter], context_length: int, val_fraction: float
) -> None:
    total = sum(w.documents for w in writers.values())
    if total == 0:
        raise DataError(f"{path} holds no conversation (it is empty or blank); give JSON lines, "
                        'one {"messages": [...]} object per line')  # fmt: skip
    need = context_length + 1
    for name, w in writers.items():
        if w.tokens < need or w.trained == 0:
            what = (f"{w.tokens:,} tokens, fewer than one window of context_length + 1 = "
                    f"{need:,}" if w.tokens < need else "no assistant token to train on")  # fmt: skip
            raise DataError(
                f"{name}.bin would hold {what} ({w.documents:,} of {total:,} conversations); "
                f"nothing was written: "
                + (f"raise --val-fraction (now {val_fraction}) or add conversations"
                   if name == "val" else f"lower --val-fraction (now {val_fraction}) or add "
                   "conversations")  # fmt: skip
            )


def chat_summary(r: PrepareResult) -> list[str]:
    """What `lmcore data prepare --chat` prints."""
    m = r.meta
    chat: dict[str, Any] = m.chat or {}
    trained = chat.get("trained_tokens", {})
    splits = ", ".join(
        f"{n} {s.tokens:,} tokens ({trained.get(n, 0):,} trained), {s.documents:,} conversations"
        for n, s in m.splits.items()
    )
    return [
        f"data: {r.out_dir}: train.bin, val.bin ({m.dtype}) with loss masks and document "
        "starts, tokenizer.json, meta.json",
        f"template: {m.tokenizer_from}'s tokenizer ({m.vocab_size:,} tokens) and chat template",
        f"tokens: {splits}",
        f"time: {r.seconds:.1f} s",
    ]
