"""`lmcore chat MODEL`: an interactive conversation in the model's own chat template, streaming,
with the KV cache kept from one turn to the next.

Each turn renders the whole conversation with the stored template (`SavedTokenizer.render_chat`)
and encodes it; only what follows the tokens already in the cache is run through the model (a
reply re-encoded differently from the tokens that were generated keeps the common prefix
cached). A reply ends at the model's end-of-turn or end-of-text token.

A conversation that fills the context does not end the session: the oldest exchanges are
dropped (one line says so) until the prompt leaves room for a reply; a message too long for the
context on its own is not sent, and the session goes on. Messages are read as UTF-8: input that
is not (binary, Latin-1) is refused naming its line and byte, rather than guessed at; a closed
stdin is refused at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lmcore.cli.common import (
    COMPILE_HELP,
    DTYPE_HELP,
    DTYPES,
    UsageError,
    checkpoint_warnings,
    positive,
    say,
    seed_value,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from lmcore.model.cache import KVCache
    from lmcore.model.generate import Decoder, Sampling
    from lmcore.model.transformer import TransformerLM
    from lmcore.tokenizer import SavedTokenizer

COMMANDS_HELP = "/reset starts a new conversation, /quit (or end of input) leaves"


class ContextFull(UsageError):
    """A message that, alone in the conversation, leaves no room for a reply (the session goes
    on without it)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "chat",
        help="talk with a model in its chat template, streaming, keeping the KV cache",
        description="An interactive chat with a checkpoint that stores its tokenizer and chat "
        "template (converted from a GGUF file or a Hugging Face directory). Type a message and "
        f"press Enter; {COMMANDS_HELP}. Replies stream as they are produced and end at the "
        "model's end-of-turn token; the conversation so far stays in the KV cache.",
    )
    p.add_argument("model", metavar="MODEL", help="a checkpoint file or directory, or a run")
    p.add_argument("--system", metavar="TEXT", help="a system message opening the conversation")
    p.add_argument(
        "--max-new-tokens", type=positive, default=512, metavar="N", help="per reply (512)"
    )
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy (default: 0.7)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling (default: 0.9)")
    p.add_argument("--top-k", type=positive, help="keep only the K most likely tokens")
    p.add_argument("--seed", type=seed_value, help="seeds sampling (default: unseeded)")
    p.add_argument("--show-special", action="store_true", help="print special tokens too")
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N"
    )
    p.add_argument("--dtype", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    p.set_defaults(func=run)


@dataclass
class Conversation:
    """A chat with `model`: the messages so far, and the token ids its KV cache holds."""

    model: TransformerLM | Decoder
    saved: SavedTokenizer
    tokenizer: Tokenizer
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    kv: KVCache | None = None

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        from lmcore.model.cache import KVCache

        self.messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        self.cached = []
        if self.kv is None:
            self.kv = KVCache.for_model(self.model, 1)
        self.kv.reset()

    def _prompt(
        self, text: str, max_new_tokens: int, notify: Callable[[str], None]
    ) -> tuple[list[dict[str, str]], list[int]]:
        """The messages with the user's `text`, and their tokens, the oldest exchanges dropped
        (saying so through `notify`) while the prompt leaves fewer than
        min(`max_new_tokens`, a quarter of the context) positions for the reply."""
        room = self.model.spec.context_length
        want = max(1, min(max_new_tokens, room // 4))
        head = 1 if self.system is not None else 0  # the system message always stays
        messages = [*self.messages, {"role": "user", "content": text}]
        dropped = 0
        while True:
            full = self.tokenizer.encode(
                self.saved.render_chat(messages, tokenizer=self.tokenizer),
                add_special_tokens=False,
            ).ids
            if room - len(full) + 1 >= want or len(messages) - head < 3:
                break
            messages = [*messages[:head], *messages[head + 2 :]]  # one exchange: user, reply
            dropped += 1
        if room - len(full) + 1 < 1:
            raise ContextFull(
                f"your message makes a prompt of {len(full)} tokens, beyond the model's context "
                f"of {room}: not sent (the session goes on); write a shorter one"
            )
        if dropped:
            left = (len(messages) - head - 1) // 2
            notify(
                f"(the conversation filled the model's context of {room} tokens: the oldest "
                f"{dropped} exchange{'s' if dropped > 1 else ''} dropped, {left} kept; /reset "
                "starts over)"
            )
        return messages, full

    def turn(
        self,
        text: str,
        write: Callable[[str], None],
        sampling: Sampling,
        *,
        max_new_tokens: int = 512,
        show_special: bool = False,
        notify: Callable[[str], None] = lambda _: None,
    ) -> list[int]:
        """Answer the user's `text`, writing the reply as it streams, each token picked as
        `sampling` says; the reply's token ids. When the conversation fills the context, the
        oldest exchanges are dropped, said through `notify`; `ContextFull` when the message
        leaves no room even alone (the conversation is left as it was)."""
        import torch

        messages, full = self._prompt(text, max_new_tokens, notify)
        room = self.model.spec.context_length
        max_new_tokens = min(max_new_tokens, room - len(full) + 1)  # what the context holds
        keep = 0  # the longest prefix of `full` that the cache holds already
        for a, b in zip(self.cached, full, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(full) - 1)  # at least one new token runs through the model
        assert self.kv is not None
        if not self.kv.can_truncate(keep):
            # A recurrent mixer's state holds every token so far and cannot go back to the
            # common prefix: the whole prompt runs again.
            keep = 0
        self.kv.truncate(keep)
        stops = list(self.saved.stop_token_ids) or None
        out: list[int] = []
        shown = ""
        skip = not show_special
        steps = self.model.stream(
            torch.tensor(full[keep:]), max_new_tokens, sampling, stop_token=stops, kv_cache=self.kv
        )
        for t in steps:
            out.append(int(t))
            reply = self.tokenizer.decode(out, skip_special_tokens=skip)
            if not reply.endswith("\ufffd"):  # a character split across tokens: wait
                write(reply[len(shown) :])
                shown = reply
        write(self.tokenizer.decode(out, skip_special_tokens=skip)[len(shown) :])
        answer = self.tokenizer.decode(out, skip_special_tokens=True)
        self.messages = [*messages, {"role": "assistant", "content": answer.strip()}]
        self.cached = full + out[:-1]  # the last token sampled was never fed in
        return out


def run(args: argparse.Namespace) -> int:
    from lmcore.errors import GenerationError
    from lmcore.model.inputs import resolve_device
    from lmcore.sources import locate

    if sys.stdin is None or sys.stdin.closed:
        raise UsageError(
            "stdin is closed: lmcore chat reads your messages from it; type them, or pipe them "
            "in (printf 'Hi\\n' | lmcore chat MODEL)"
        )
    where = locate(args.model, directories=True)
    if where.kind != "checkpoint":
        raise UsageError(f"MODEL {args.model!r} is not a checkpoint (a .safetensors file or dir)")
    import torch

    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    with checkpoint_warnings(args.command):
        src = where.open()
        model = src.model(resolve_device(args.device), dtype)
    model.eval()
    saved = model.tokenizer
    if saved is None or saved.chat_template is None:
        raise UsageError(
            f"{src.path} stores no chat template; lmcore chat needs a checkpoint converted "
            "from a GGUF file or a Hugging Face directory with one (lmcore generate --prompt "
            "works with any)"
        )
    from lmcore.model.generate import Sampling, compile_decoding

    decoder = compile_decoding(model) if args.compile else model
    chat = Conversation(decoder, saved, saved.tokenizer(), system=args.system)
    try:  # a first rendering: a broken or runaway template is refused before the session
        saved.check_chat_template()
        hello = [*chat.messages, {"role": "user", "content": "Hi"}]
        saved.render_chat(hello, tokenizer=chat.tokenizer)
    except GenerationError as e:
        raise GenerationError(f"{src.path}: {e}") from None
    banner = (
        f"lmcore chat: {src.path} ({model.spec.context_length} tokens of context); "
        f"{COMMANDS_HELP}"
    )
    interactive = sys.stdin.isatty()
    announced = interactive  # piped input: said once its first line reads as text
    if interactive:
        say(banner)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    turn = 0
    for line in _lines(interactive):
        if not announced:
            say(banner)
            announced = True
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            chat.reset()
            say("(a new conversation)")
            continue
        seed = None if args.seed is None else args.seed + turn
        sampling = Sampling(args.temperature, args.top_p, args.top_k, seed=seed)
        try:
            chat.turn(
                text,
                write,
                sampling,
                max_new_tokens=args.max_new_tokens,
                show_special=args.show_special,
                notify=say,
            )
        except ContextFull as e:
            say(f"({e})")
            continue
        write("\n")
        turn += 1
    if not announced:
        say(banner)
    return 0


def _lines(interactive: bool) -> Iterator[str]:
    """The user's lines: typed at a terminal (with line editing), or read from a pipe as
    UTF-8, refusing a line that is not (naming it and its first bad byte) rather than guessing
    its encoding. A line a terminal gives that is not text is said and skipped."""
    number = 0
    while True:
        number += 1
        if interactive:
            try:
                line = input("> ")
            except EOFError:
                return
            except UnicodeDecodeError as e:
                say(f"(that line is not UTF-8 text: byte {e.object[e.start]:#04x}; not sent)")
                continue
            if any("\ud800" <= c <= "\udfff" for c in line):
                say("(that line is not UTF-8 text; not sent)")
                continue
            yield line
            continue
        stream = getattr(sys.stdin, "buffer", None)
        raw = stream.readline() if stream is not None else sys.stdin.readline()
        if not raw:
            return
        if isinstance(raw, str):
            yield raw
            continue
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(
                f"stdin line {number} is not UTF-8 text (byte {raw[e.start]:#04x} at position "
                f"{e.start}): lmcore chat reads UTF-8; convert it first (e.g. iconv -f latin1 "
                "-t utf-8)"
            ) from None
