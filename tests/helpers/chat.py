"""A tiny chat checkpoint (a ChatML template over a small byte-level BPE) and JSON lines of
conversations for it: the chat-data and fine-tuning tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

CHAT_SPEC = "vocab_size=300,context_length=32,d_model=32,num_layers=1,num_heads=2"
QUESTIONS = ["What is a list?", "What is a dict?", "How do I loop?", "What is None?",
             "Name a tuple.", "What is 2 + 3?"]  # fmt: skip
ANSWERS = ["A mutable sequence.", "A mapping of keys.", "Use a for loop.", "The null object.",
           "(1, 2) is one.", "It is 5."]  # fmt: skip


def chat_model(template: str | None = None, seed: int = 0) -> Any:
    """A random model whose tokenizer is `tests.helpers.gguf.byte_level_bpe` with ChatML
    (`<|endoftext|>` its eos)."""
    import lmcore
    from lmcore.tokenizer import SavedTokenizer
    from tests.helpers.gguf import CHATML, byte_level_bpe

    torch.manual_seed(seed)
    model = lmcore.build_model(CHAT_SPEC)
    tok = byte_level_bpe()
    model.tokenizer = SavedTokenizer.from_tokenizer(
        tok, chat_template=CHATML if template is None else template,
        eos_token_id=tok.token_to_id("<|endoftext|>"),
    )  # fmt: skip
    return model


def chat_checkpoint(directory: Path, template: str | None = None) -> Path:
    path: Path = chat_model(template).save(directory / "chat.safetensors")
    return path


def conversations(n: int = 24) -> list[dict[str, Any]]:
    """`n` records, alternating the `messages` form (some with a system turn, some with two
    exchanges) and the `instruction` form."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        q, a = QUESTIONS[i % len(QUESTIONS)], ANSWERS[i % len(ANSWERS)]
        if i % 3 == 2:
            out.append({"instruction": q, "input": "" if i % 2 else "Be brief.", "output": a})
            continue
        messages = [{"role": "system", "content": "Be terse."}] if i % 2 else []
        messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if i % 4 == 0:
            messages += [{"role": "user", "content": "Thanks"},
                         {"role": "assistant", "content": "Welcome."}]  # fmt: skip
        out.append({"messages": messages})
    return out


def write_chats(path: Path, records: list[Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = conversations() if records is None else records
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
