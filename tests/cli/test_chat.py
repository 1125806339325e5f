"""`lmcore chat` under hostile input (issue 32): a conversation that fills the context goes on
(the oldest exchanges dropped, said in one line), and a closed stdin, input that is not UTF-8,
a template with a syntax error or past its budget each end it in one line, exit 2."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.cli.chat import ContextFull, Conversation
from lmcore.cli.main import main
from lmcore.model.generate import GREEDY
from lmcore.tokenizer import SavedTokenizer
from tests.helpers.errors import assert_naming, raises_naming
from tests.helpers.gguf import CHATML, byte_level_bpe

pytest.importorskip("jinja2", reason="needs the 'chat' extra: pip install -e '.[chat]'")

SPEC = "vocab_size=300,context_length=64,d_model=32,num_layers=1,num_heads=2"


def _chatty(template: str = CHATML) -> lmcore.TransformerLM:
    """A random model of 64 tokens of context whose tokenizer has no stop token: every reply
    is as long as it may be."""
    torch.manual_seed(0)
    model = lmcore.build_model(SPEC)
    model.tokenizer = SavedTokenizer(json=byte_level_bpe().to_str(), chat_template=template)
    return model


def test_a_full_context_drops_the_oldest_exchanges_and_the_conversation_goes_on() -> None:
    model = _chatty()
    saved = model.tokenizer
    assert saved is not None
    tok = saved.tokenizer()

    def length(messages: list[dict[str, str]]) -> int:  # a prompt's tokens
        return len(tok.encode(saved.render_chat(messages, tokenizer=tok),
                              add_special_tokens=False).ids)  # fmt: skip

    chat = Conversation(model, saved, tok)
    said: list[str] = []
    first = chat.turn("Hello", lambda _: None, GREEDY, max_new_tokens=40, notify=said.append)
    alone = length([{"role": "user", "content": "Hello"}])
    assert len(first) == min(40, 64 - alone + 1) and not said  # what the context holds
    after = [*chat.messages, {"role": "user", "content": "And then?"}]
    assert 64 - length(after) + 1 < 16  # less room than a quarter of the context: drop
    second = chat.turn("And then?", lambda _: None, GREEDY, max_new_tokens=40, notify=said.append)
    assert len(said) == 1
    assert_naming(said[0], "context of 64 tokens", "the oldest 1 exchange dropped", "0 kept",
                  "/reset")  # fmt: skip
    assert [m["content"] for m in chat.messages[::2]] == ["And then?"]
    assert len(second) == min(40, 64 - length(chat.messages[:1]) + 1)
    assert len(chat.cached) <= 64
    before = list(chat.messages)
    with raises_naming(ContextFull, "beyond the model's context of 64", "not sent",
                       "the session goes on"):  # fmt: skip
        chat.turn("cat " * 80, lambda _: None, GREEDY, notify=said.append)
    assert chat.messages == before  # the conversation is as it was


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return Path(_chatty().save(tmp_path / "chat.safetensors"))


CHAT = ["--seed", "0", "--temperature", "0", "--max-new-tokens", "40"]


def _chat(ckpt: Path, stdin: bytes | None, monkeypatch: pytest.MonkeyPatch, *more: str) -> int:
    stream = None if stdin is None else io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stream)
    return main(["chat", str(ckpt), *CHAT, *more])


def test_chat_keeps_the_session_when_the_context_fills(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # P-chat-full
    said = b"Hello\nAnd then?\n" + b"cat " * 80 + b"\n/reset\nHi\n"
    assert _chat(ckpt, said, monkeypatch) == 0
    out, err = capsys.readouterr()
    assert_naming(err, "the oldest 1 exchange dropped", "not sent", "(a new conversation)")
    # said in that order, each once, and the session went on past them
    notes = [line for line in err.splitlines() if line.startswith("(")]
    assert len(notes) == 3 and "dropped" in notes[0] and "not sent" in notes[1]
    assert notes[2] == "(a new conversation)" and out.strip()


@pytest.mark.parametrize(
    ("stdin", "facts"),
    [
        (None, ("stdin is closed", "pipe them in")),  # P-chat-stdin-closed
        (b"\x00\x01\xff\xfe\x80\x81binary\n", ("stdin line 1 is not UTF-8", "byte 0xff",
                                               "position 2")),  # P-chat-stdin-binary
        (b"Hi\ncaf\xe9\n", ("stdin line 2 is not UTF-8", "byte 0xe9", "position 3",
                            "iconv -f latin1")),  # P-chat-stdin-latin1
    ],  # fmt: skip
    ids=["closed", "binary", "latin1"],
)
def test_stdin_that_is_closed_or_not_utf8_ends_chat_in_one_line(
    ckpt: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stdin: bytes | None,
    facts: tuple[str, ...],
) -> None:
    assert _chat(ckpt, stdin, monkeypatch) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("lmcore chat: error: ")
    assert_naming(err, *facts)


LOOPS = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize(
    ("template", "facts"),
    [
        ("{% for m in messages %}{{ m.content }}", ("syntax error at line 1", "'endfor'")),
        (LOOPS.replace("%}{% endfor", "%}{{ 'x' * 1000 }}{% endfor", 1),
         ("wrote past 4,000,000 characters", "5 s and 4,000,000 characters")),
    ],  # fmt: skip
    ids=["syntax", "gigabytes"],  # P-chat-syntax, P-chat-gigabytes (P-chat-endless: 5 s)
)
def test_a_broken_or_runaway_template_ends_chat_before_the_session(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    template: str,
    facts: tuple[str, ...],
) -> None:
    ckpt = _chatty(template).save(tmp_path / "chat.safetensors")
    assert _chat(Path(ckpt), b"hi\n", monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lmcore chat: error: ")  # before the banner
    assert_naming(err, "chat.safetensors", *facts)


def test_chat_compile_gives_the_eager_replies_turn_after_turn(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--compile`: the conversation runs through `compile_decoding` (dynamo with the eager
    backend here: the plumbing, not inductor's time), its KV cache kept from turn to turn, and
    every greedy reply is the eager one."""
    import lmcore.model.generate as generation

    said = b"Hello\nAnd then?\n/reset\nHi\n"
    assert _chat(ckpt, said, monkeypatch) == 0
    eager = capsys.readouterr().out
    made: list[object] = []
    compile_decoding = generation.compile_decoding

    def eager_backend(model: object) -> object:
        made.append(model)
        return compile_decoding(model, backend="eager", fullgraph=True)  # type: ignore[arg-type]

    monkeypatch.setattr(generation, "compile_decoding", eager_backend)
    torch.compiler.reset()
    try:
        assert _chat(ckpt, said, monkeypatch, "--compile") == 0
    finally:
        torch.compiler.reset()
    assert len(made) == 1
    assert capsys.readouterr().out == eager and eager.count("\n") == 3
