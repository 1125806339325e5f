"""`lmcore.data.chat`: conversations in the model's own template, a loss mask that is exactly the
assistant's replies (and their end of turn), one document per conversation, a split by
conversation, masked batches; and each malformed line refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import lmcore
from lmcore.data.chat import conversation, prepare_chat, rendered
from lmcore.data.tokens import IGNORE, TokenData
from lmcore.errors import DataError
from lmcore.model import nn as model_nn
from tests.helpers.chat import chat_checkpoint, conversations, write_chats
from tests.helpers.errors import raises_naming

pytest.importorskip("jinja2", reason="needs the 'chat' extra: pip install -e '.[chat]'")


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return chat_checkpoint(tmp_path)


def _prepare(ckpt: Path, chats: Path, out: Path, **kw: object) -> TokenData:
    saved = lmcore.read_info(ckpt).tokenizer
    assert saved is not None
    prepare_chat(chats, out, tokenizer=saved, tokenizer_from=ckpt, **kw)  # type: ignore[arg-type]
    return TokenData.open(out)


def test_the_constant_is_the_models() -> None:
    assert IGNORE == model_nn.IGNORE == -100


def test_the_two_forms_give_messages() -> None:
    assert conversation({"instruction": "Sum", "input": "1 2", "output": "3"}) == [
        {"role": "user", "content": "Sum\n\n1 2"}, {"role": "assistant", "content": "3"}]
    assert conversation({"instruction": "Hi", "output": "Hello"})[0]["content"] == "Hi"
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert conversation({"messages": msgs}) == msgs


def test_the_mask_is_the_assistants_replies_and_their_end_of_turn(
    ckpt: Path, tmp_path: Path
) -> None:
    data = _prepare(ckpt, write_chats(tmp_path / "c.jsonl"), tmp_path / "d", val_fraction=0.2)
    tok = data.tokenizer()
    saved = lmcore.read_info(ckpt).tokenizer
    assert saved is not None
    docs = {s: np.fromfile(data.path / f"{s}.docs.bin", dtype="<i8") for s in ("train", "val")}
    records = conversations()
    seen = 0
    for split in ("train", "val"):
        ids, mask = data.split(split), data.mask(split)
        assert mask is not None and len(mask) == len(ids)
        bounds = [*docs[split].tolist(), len(ids)]
        assert bounds[0] == 0 and all(a < b for a, b in zip(bounds, bounds[1:]))
        seen += len(bounds) - 1
        for a, b in zip(bounds, bounds[1:]):
            text = tok.decode(ids[a:b].tolist(), skip_special_tokens=False)
            trained = tok.decode(ids[a:b][mask[a:b] == 1].tolist(), skip_special_tokens=False)
            # the whole conversation as lmcore chat renders it, and the replies alone
            record = next(r for r in records
                          if saved.render_chat(conversation(r), add_generation_prompt=False)
                          == text)  # fmt: skip
            replies = [m["content"] for m in conversation(record) if m["role"] == "assistant"]
            assert trained == "".join(f"{r}<|im_end|>\n" for r in replies)
    assert seen == len(records)
    meta = data.meta
    assert meta.masks == {"train": "train.mask.bin", "val": "val.mask.bin"}
    assert meta.documents == {"train": "train.docs.bin", "val": "val.docs.bin"}
    # the conversations' starts are the data's document index (--pack, --doc-mask read it)
    assert data.documents is not None and meta.has_documents
    assert all(data.documents[s].tolist() == docs[s].tolist() for s in ("train", "val"))
    assert meta.splits["val"].documents >= 1 and meta.splits["train"].documents > meta.splits[
        "val"].documents
    assert meta.chat is not None and meta.chat["conversations"] == {"messages": 16,
                                                                    "instruction": 8}
    assert meta.chat["trained_tokens"]["train"] == int(np.asarray(data.mask("train")).sum())


def test_masked_batches_put_ignore_where_the_mask_is_zero(ckpt: Path, tmp_path: Path) -> None:
    data = _prepare(ckpt, write_chats(tmp_path / "c.jsonl"), tmp_path / "d", val_fraction=0.2)
    sampler = data.sampler("train", batch_size=4, context_length=16, seed=3)
    x, y = sampler.batch(0)
    ids, mask = np.asarray(data.train, dtype=np.int64), np.asarray(data.mask("train"))
    for row, s in enumerate(sampler.starts(0)):
        assert x[row].tolist() == ids[s : s + 16].tolist()
        want = np.where(mask[s + 1 : s + 17] == 1, ids[s + 1 : s + 17], IGNORE)
        assert y[row].tolist() == want.tolist()
    val = data.val_batches(batch_size=2, context_length=16)
    assert val.masked
    vy = torch.cat([b[1] for b in val])
    assert (vy == IGNORE).any() and (vy != IGNORE).any()
    # the loss over the batch is torch's with ignore_index
    logits = torch.randn(*vy.shape, 300)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 300), vy.reshape(-1),
                                                 ignore_index=-100)  # fmt: skip
    torch.testing.assert_close(model_nn.cross_entropy(logits, vy), expected)


def test_data_without_a_mask_gives_the_same_batches_as_before(tiny_data: Path) -> None:
    data = TokenData.open(tiny_data)
    assert not data.masked and data.mask("train") is None
    x, y = data.sampler("train", batch_size=2, context_length=8, seed=0).batch(5)
    starts = data.sampler("train", batch_size=2, context_length=8, seed=0).starts(5)
    ids = np.asarray(data.train, dtype=np.int64)
    assert y.tolist() == [ids[s + 1 : s + 9].tolist() for s in starts]
    assert not data.val_batches(batch_size=2, context_length=8).masked


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path: Path) -> None:
    # it drops the earlier assistant turns once a later one follows (as reasoning templates do)
    hiding = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
              "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ckpt = chat_checkpoint(tmp_path, hiding)
    chats = write_chats(tmp_path / "c.jsonl", conversations(1))  # two exchanges
    with raises_naming(DataError, "line 1", "assistant message 2", "differently"):
        _prepare(ckpt, chats, tmp_path / "d")
    assert not (tmp_path / "d").exists()


BAD = [
    (b'{"messages": [{"role": "user", "content": "hi"}]}\n', "line 2 has no assistant message"),
    (b"not json\n", "line 2 is not JSON"),
    (b'{"messages": [{"role": "usr", "content": "hi"}]}\n', "did you mean 'user'"),
    (b'{"messages": [{"content": "hi"}]}\n', "message 1 has no 'role'"),
    (b'{"messages": [{"role": "user", "content": 3}]}\n', "no text 'content'"),
    (b'{"prompt": "x"}\n', "neither 'messages' nor 'instruction'/'output'"),
    (b'[1, 2]\n', "is a JSON list"),
    (b'{"instruction": "x"}\n', "'output' should be text"),
    (b"PK\x03\x04\x00\x00\n", "line 2 holds a NUL byte"),
    (b"\x89PNG\r\n\x1a\n", "line 2 is not UTF-8"),
    (b'{"instruction": "caf\xe9", "output": "x"}\n', "line 2 is not UTF-8"),
]


@pytest.mark.parametrize(("line", "named"), BAD)
def test_a_malformed_line_is_refused_naming_it(
    ckpt: Path, tmp_path: Path, line: bytes, named: str
) -> None:
    good = json.dumps(conversations(1)[0]).encode() + b"\n"
    chats = tmp_path / "c.jsonl"
    chats.write_bytes(good + line + good)
    with raises_naming(DataError, str(chats), named):
        _prepare(ckpt, chats, tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_a_template_that_fails_names_the_line(tmp_path: Path) -> None:
    failing = ("{% for m in messages %}{% if m['content'] == 'boom' %}"
               "{{ raise_exception('no boom here') }}{% endif %}{{ m['content'] }}"
               "{% endfor %}")
    ckpt = chat_checkpoint(tmp_path, failing)
    rows = [*conversations(3), {"instruction": "boom", "output": "x"}]
    with raises_naming(DataError, "line 4", "the chat template fails", "no boom here"):
        _prepare(ckpt, write_chats(tmp_path / "c.jsonl", rows), tmp_path / "d")


def test_an_empty_file_and_too_few_conversations_are_refused(ckpt: Path, tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n")
    with raises_naming(DataError, "holds no conversation"):
        _prepare(ckpt, empty, tmp_path / "d")
    with raises_naming(DataError, "val.bin would hold", "raise --val-fraction"):
        _prepare(ckpt, write_chats(tmp_path / "one.jsonl", conversations(1)), tmp_path / "d")


def test_the_ids_are_those_lmcore_chat_encodes(ckpt: Path) -> None:
    saved = lmcore.read_info(ckpt).tokenizer
    assert saved is not None
    tok = saved.tokenizer()
    messages = conversation(conversations(2)[1])  # with a system turn
    ids, mask = rendered(saved, messages, tok)
    text = saved.render_chat(messages, add_generation_prompt=False, tokenizer=tok)
    assert ids.tolist() == tok.encode(text, add_special_tokens=False).ids
    # everything up to the generation prompt is the prompt: untrained
    prompt = saved.render_chat(messages[:-1], add_generation_prompt=True, tokenizer=tok)
    n = len(tok.encode(prompt, add_special_tokens=False).ids)
    assert not mask[:n].any() and mask[n:].all()
