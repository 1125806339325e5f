"""A chat's conversation (`lmcore.cli.chat.Conversation`): each turn continues the KV cache of the
turns before it, and gives the tokens a fresh run over the whole rendered conversation gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lmcore
from lmcore.cli.chat import Conversation
from lmcore.model.generate import GREEDY
from lmcore.tokenizer import SavedTokenizer
from tests.helpers.gguf import CHATML, byte_level_bpe

pytest.importorskip("jinja2", reason="needs the 'chat' extra: pip install -e '.[chat]'")


# A recurrent mixer's state cannot go back to a shorter prefix: the turn then feeds the whole
# prompt again (and where the prompt continues what the cache holds, only the new tokens).
@pytest.mark.parametrize(
    "extra",
    ["", ",mixer=short_conv,mixer[1]=attention", ",mixer=gated_deltanet,mixer[1]=mla",
     ",mixer=mamba2,mixer[1]=attention"],  # fmt: skip
)
def test_chat_continues_its_kv_cache_as_a_fresh_run_would(tmp_path: Path, extra: str) -> None:
    tok = byte_level_bpe()
    saved = SavedTokenizer.from_tokenizer(tok, chat_template=CHATML, eos_token_id=2)
    torch.manual_seed(0)
    model = lmcore.build_model(
        "vocab_size=300,context_length=256,d_model=32,num_layers=2,num_heads=2,d_ff=64" + extra
    )
    chat = Conversation(model, saved, tok)
    chat.turn("Hello", lambda _: None, GREEDY, max_new_tokens=8)
    second = chat.turn("the cat", lambda _: None, GREEDY, max_new_tokens=8)
    prompt = tok.encode(
        saved.render_chat(chat.messages[:-1], tokenizer=tok), add_special_tokens=False
    ).ids
    fresh = model.generate(torch.tensor(prompt), 8, GREEDY, stop_token=[2, 0])
    assert second == fresh.tolist()
    # The cache was sized to the first turn, then grown once for the second, not to the context
    assert chat.kv is not None and chat.kv.grown == 2
    assert chat.kv.length <= chat.kv.capacity < model.spec.context_length
