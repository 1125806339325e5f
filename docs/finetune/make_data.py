"""Question/answer chats from Python's own documentation, for the LoRA fine-tuning walk-through
(docs/training.md, "Fine-tuning SmolLM2 with LoRA"): text every machine with Python has.

    python docs/finetune/make_data.py OUT_DIR

For each public function of a few standard-library modules, "What does `json.dumps` do?" is
answered by the first sentence of its docstring. OUT_DIR/chats.jsonl (the modules to train on;
`lmcore data prepare --chat` splits off its validation set) and OUT_DIR/held_out.jsonl (other
modules, never trained on: the questions to ask `lmcore chat` before and after) are written in
the `messages` form, one conversation a line, in a fixed order.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from pathlib import Path

TRAIN = ("json", "os.path", "shutil", "string", "textwrap", "itertools", "functools", "math",
         "statistics", "random", "re", "base64", "heapq", "bisect", "glob", "fnmatch",
         "operator", "copy", "zlib", "binascii", "calendar", "difflib", "html", "keyword",
         "struct", "tempfile", "uuid", "secrets", "platform", "time")  # fmt: skip
HELD_OUT = ("gzip", "hashlib", "colorsys", "filecmp", "shlex", "locale")


def first_sentence(doc: str) -> str | None:
    """The docstring's first sentence, on one line; None when it has none worth asking about
    (a signature line, too short, too long)."""
    text = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())
    if not text or "(" in text.split(" ")[0] or "-->" in text:  # "dumps(obj) -> str": a signature
        return None
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    sentence = match.group(1) if match else text + "."
    return sentence if 12 <= len(sentence) <= 200 else None


def pairs(module_name: str) -> list[tuple[str, str]]:
    module = importlib.import_module(module_name)
    out = []
    for name in sorted(dir(module)):
        obj = getattr(module, name)
        if name.startswith("_") or not callable(obj) or inspect.isclass(obj):
            continue
        answer = first_sentence(getattr(obj, "__doc__", None) or "")
        if answer is not None:
            out.append((f"What does `{module_name}.{name}` do?", answer))
    return out


def chat(question: str, answer: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": question},
                                    {"role": "assistant", "content": answer}]})  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/finetune/make_data.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for file, modules in (("chats.jsonl", TRAIN), ("held_out.jsonl", HELD_OUT)):
        rows = [chat(q, a) for m in modules for q, a in pairs(m)]
        (out / file).write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        print(f"{out / file}: {len(rows)} conversations from {len(modules)} modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
