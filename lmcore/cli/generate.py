"""`lmcore generate SPEC|CHECKPOINT`: text (or token ids) after a prompt, streaming, with a KV
cache; where a checkpoint's tokenizer is found.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmcore.cli.common import (
    COMPILE_HELP,
    DTYPE_HELP,
    DTYPES,
    OR_CHECKPOINT,
    UsageError,
    checkpoint_warnings,
    opened,
    positive,
    say,
    seed_value,
    torch_dtype,
)

if TYPE_CHECKING:
    from lmcore.sources import Source


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="write text (or token ids) after a prompt, streaming, with a KV cache",
        description="Generate from a model: a checkpoint (its weights and the tokenizer saved "
        "with it or its run) or a spec (seeded random weights). New text streams to stdout as "
        "it is produced; tokens/s go to stderr. Sampling: --temperature 0 is greedy; "
        "--top-k and --top-p cut the distribution first.",
    )
    p.add_argument(
        "spec",
        metavar="SPEC|CHECKPOINT",
        help=f"spec string (random weights), {OR_CHECKPOINT}, a checkpoint directory (holding "
        "model.safetensors) or a run directory (its latest checkpoint)",
    )
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="a text prompt (needs a tokenizer)")
    prompt.add_argument(
        "--prompt-ids", metavar="1,2,3", type=_ids, help="token ids, comma-separated"
    )
    prompt.add_argument(
        "--chat",
        metavar="TEXT",
        help="a user message, in the model's chat template (stored with the checkpoint)",
    )
    p.add_argument("--system", metavar="TEXT", help="--chat: a system message before it")
    p.add_argument(
        "--show-special",
        action="store_true",
        help="print special tokens (<|im_end|>, ...) too; hidden by default",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive,
        metavar="N",
        help="tokens to generate (default: as many as fit in the context, at most 256)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="0 is greedy (default: 1.0)")
    p.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="keep the most likely tokens making up this probability (default: 1.0, all)",
    )
    p.add_argument("--top-k", type=positive, help="keep only the K most likely tokens")
    p.add_argument(
        "--stop-token",
        type=int,
        metavar="ID",
        help="end at this token id (default: the stored tokenizer's end-of-text and end-of-turn "
        "ids, else the tokenizer's <|endoftext|>, if it has one)",
    )
    p.add_argument(
        "--seed",
        type=seed_value,
        help="seeds sampling (and a spec's random weights; default: unseeded sampling)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json to use (default: the checkpoint's own, else found beside it or in "
        "its run)",
    )
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N"
    )
    p.add_argument("--dtype", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="recompute the whole sequence at every step instead of using a KV cache",
    )
    p.add_argument("--compile", action="store_true", help=COMPILE_HELP)
    p.set_defaults(func=run)


def per_second(count: int, seconds: float, unit: str = "tokens") -> str:
    """A rate to read: `1,234 tokens/s`, three significant digits below 100 (`0.973
    tokens/s`, never a rounded-off `0 tokens/s`), and the seconds each takes below one a
    second (`0.973 tokens/s, 1.03 s/token`)."""
    if seconds <= 0 or count <= 0:
        return f"{count:,} {unit} in {seconds:.2g} s"
    rate = count / seconds
    if rate >= 100:
        return f"{rate:,.0f} {unit}/s"
    shown = f"{rate:.3g} {unit}/s"
    return shown if rate >= 1 else f"{shown}, {seconds / count:.3g} s/{unit.removesuffix('s')}"


def _ids(text: str) -> list[int]:
    parts = [t.strip() for t in text.split(",")]
    if not parts or not all(re.fullmatch(r"\d{1,19}", t) for t in parts):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids such as 1,2,3, got {text!r}"
        )
    return [int(t) for t in parts]


def _check_utf8(prompt: str, option: str = "--prompt") -> None:
    """Bytes of the command line that are not UTF-8 reach Python as lone surrogates (PEP 383)."""
    bad = next((i for i, c in enumerate(prompt) if "\udc80" <= c <= "\udcff"), None)
    if bad is not None:
        byte = ord(prompt[bad]) - 0xDC00
        raise UsageError(
            f"{option} holds a byte that is not UTF-8 (0x{byte:02x} at character {bad}); give "
            "the prompt as UTF-8 text (e.g. convert it with iconv), or its ids with --prompt-ids"
        )


def chat_messages(user: str, system: str | None = None) -> list[dict[str, str]]:
    """The messages of one chat turn: a system message (when given), then the user's."""
    for name, text in (("--chat", user), ("--system", system or "")):
        _check_utf8(text, name)
    head = [] if system is None else [{"role": "system", "content": system}]
    return [*head, {"role": "user", "content": user}]


def _tokenizer(args: argparse.Namespace, src: Source) -> Any:
    """The tokenizer to use: --tokenizer, else the checkpoint's own, else the one found for it
    (`Source.tokenizer_search`); None when the prompt is ids and none is found (ids are then
    printed)."""
    from lmcore.runfiles import TokenizerSearch
    from lmcore.sources import read_tokenizer

    if args.tokenizer is not None:
        given = Path(args.tokenizer)
        if not given.is_file():
            raise UsageError(f"--tokenizer {args.tokenizer!r} does not exist")
        search = TokenizerSearch(given, (given,))
    elif src.saved_tokenizer is not None:
        return src.saved_tokenizer.tokenizer()  # saved with the model
    else:
        search = src.tokenizer_search()
    if search.found is None:
        if args.prompt is None and args.chat is None:
            return None
        where = search.looked() if search.places else "a spec has no tokenizer"
        raise UsageError(
            f"{'--chat' if args.prompt is None else '--prompt'} needs a tokenizer, but none was "
            f"found for {args.spec!r} ({where}{search.unknown()}); "
            "pass --tokenizer PATH (e.g. the tokenizer.json lmcore data prepare wrote), or give "
            "token ids with --prompt-ids 1,2,3"
        )
    return read_tokenizer(search.found, UsageError)


def run(args: argparse.Namespace) -> int:
    import time

    import torch

    from lmcore.model.inputs import resolve_device
    from lmcore.runfiles import with_checkpoint
    from lmcore.sources import locate, open_checkpoint

    where = locate(args.spec, directories=True)  # a checkpoint, its directory or run, or a spec
    device = resolve_device(args.device)
    if where.kind == "checkpoint":

        def read(file: Path) -> tuple[Source, Any, Any]:
            src = open_checkpoint(file, find=False)
            return src, src.model(device, torch_dtype(args, src.info)), _tokenizer(args, src)

        with checkpoint_warnings(args.command):  # a training run may prune what it lists
            src, model, tok = with_checkpoint(args.spec, read)
    else:
        src = opened(args, where)
        torch.manual_seed(args.seed or 0)
        model = src.model(device, torch_dtype(args, None))
        tok = _tokenizer(args, src)
    saved = model.tokenizer if args.tokenizer is None else None
    vocab = model.spec.vocab_size
    if args.system is not None and args.chat is None:
        raise UsageError("--system applies to --chat only")
    if args.chat is not None:
        if saved is None:
            raise UsageError(
                "--chat needs the model's chat template, stored with a checkpoint converted from "
                "a GGUF file or a Hugging Face directory; this model has none: use --prompt"
            )
        messages = chat_messages(args.chat, args.system)
        ids = tok.encode(saved.render_chat(messages, tokenizer=tok), add_special_tokens=False).ids
    elif args.prompt is not None:
        _check_utf8(args.prompt)
        ids = tok.encode(args.prompt).ids
        if not ids:
            raise UsageError("--prompt encodes to no tokens; give some text")
    else:
        ids = args.prompt_ids
    if tok is not None and tok.get_vocab_size() > vocab:
        raise UsageError(
            f"the tokenizer has {tok.get_vocab_size():,} tokens but the model's vocab_size is "
            f"{vocab:,}; use the tokenizer the model was trained with"
        )
    stop: int | list[int] | None = args.stop_token
    if stop is None and saved is not None and saved.stop_token_ids:
        stop = list(saved.stop_token_ids)
    elif stop is None and tok is not None:
        stop = tok.token_to_id("<|endoftext|>")
    skip = not args.show_special
    n = args.max_new_tokens or max(1, min(256, model.spec.context_length - len(ids) + 1))
    from lmcore.model.generate import DecodingModel, Sampling, compile_decoding, stream

    decoder: DecodingModel = compile_decoding(model) if args.compile else model
    start = time.perf_counter()
    sampling = Sampling(args.temperature, args.top_p, args.top_k, seed=args.seed)
    steps = stream(
        decoder, torch.tensor(ids), n, sampling, stop_token=stop, cache=not args.no_cache
    )
    out: list[int] = []
    shown = ""
    for t in steps:
        out.append(int(t))
        if tok is None:
            sys.stdout.write(f"{' ' if len(out) > 1 else ''}{out[-1]}")
        else:
            text = tok.decode(out, skip_special_tokens=skip)
            if text.endswith("\ufffd"):
                continue  # a character split across tokens: wait for its other bytes
            sys.stdout.write(text[len(shown) :])
            shown = text
        sys.stdout.flush()
    if tok is not None:
        sys.stdout.write(tok.decode(out, skip_special_tokens=skip)[len(shown) :])
    sys.stdout.write("\n")
    seconds = time.perf_counter() - start
    stops = [stop] if isinstance(stop, int) else stop or []
    ended = f" (stop token {out[-1]})" if out and out[-1] in stops else ""
    mode = "KV cache" if not args.no_cache else "recomputed each step"
    mode += ", compiled: the first step compiles" if args.compile else ""
    say(
        f"lmcore generate: {len(out)} tokens{ended} in {seconds:.2f} s, "
        f"{per_second(len(out), seconds)} ({mode}, prompt {len(ids)} tokens, "
        f"{str(model.lm_head.weight.dtype).removeprefix('torch.')} on {device})"
    )
    return 0
