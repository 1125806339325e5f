"""`lmcore eval MODEL`: loss, perplexity and bits per byte over text or prepared data, or
lm-evaluation-harness tasks run with lmcore's own model class.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

from lmcore.atomic import atomic_write
from lmcore.cli.common import DTYPES, UsageError, checkpoint_warnings, positive, say
from lmcore.cli.generate import per_second
from lmcore.errors import LmcoreError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="loss, perplexity and bits per byte on text or data; lm-evaluation-harness tasks",
        description="Evaluate a trained model. With --text or --data: the mean loss per token, "
        "perplexity and bits per byte (total nats / (ln 2 × UTF-8 bytes), comparable across "
        "tokenizers) over windows of the context length, batched. With --tasks: "
        "lm-evaluation-harness tasks (the 'eval' extra) through lmcore's own lm-eval model, "
        "which scores with lmcore's batching and KV cache.",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="a model file (.safetensors), a checkpoint directory or a run directory (its "
        "newest checkpoint)",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", nargs="+", metavar="FILE", help="UTF-8 text files, each a document")
    what.add_argument("--data", metavar="DIR", help="prepared data (lmcore data prepare)")
    what.add_argument(
        "--tasks", metavar="NAME[,NAME...]", help="lm-evaluation-harness tasks, comma-separated"
    )
    p.add_argument(
        "--split", choices=("val", "train"), default="val", help="with --data (default: val)"
    )
    p.add_argument(
        "--stride",
        type=positive,
        metavar="N",
        help="with --text/--data: tokens between window starts (default: the context length, "
        "non-overlapping; less gives every scored token at least context - N tokens of context)",
    )
    p.add_argument(
        "--context",
        type=positive,
        metavar="N",
        help="with --text/--data: windows of up to N tokens, at most the model's context_length "
        "(default: it), e.g. the --context a fine-tune trained with",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json (default: found beside the checkpoint, in its run or its data)",
    )
    p.add_argument(
        "--batch-size", type=positive, default=8, metavar="B", help="windows or requests per "
        "forward (default: 8; the numbers do not depend on it)"
    )  # fmt: skip
    p.add_argument(
        "--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda:N"
    )
    p.add_argument("--dtype", choices=DTYPES, help="default: the checkpoint's own")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    lm = p.add_argument_group("lm-evaluation-harness (with --tasks)")
    lm.add_argument(
        "--include-path",
        action="append",
        metavar="DIR",
        help="a directory of task YAML files to add to lm-eval's (repeatable)",
    )
    lm.add_argument(
        "--limit",
        type=_limit,
        metavar="N",
        help="documents per task: a count, or a fraction below 1 (for quick checks)",
    )
    lm.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples per prompt")
    lm.add_argument(
        "--output",
        metavar="PATH",
        help="write lm-eval's results as JSON to this file (a directory: DIR/results.json); "
        "checked before the evaluation; an existing file is replaced only if it holds results",
    )
    lm.add_argument("--seed", type=int, default=0, help="lm-eval's seeds (default: 0)")
    p.set_defaults(func=run)


def _limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)) or (value >= 1 and value != int(value)):
        raise argparse.ArgumentTypeError(
            f"expected a number of documents (e.g. 100) or a fraction below 1 (e.g. 0.1), got "
            f"{text!r}"
        )
    return value


def run(args: argparse.Namespace) -> int:
    if args.tasks is None:
        for flag in ("include_path", "limit", "num_fewshot", "output"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} applies to --tasks only")
        return _windows(args)
    if args.stride is not None or args.context is not None or args.split != "val":
        raise UsageError("--stride, --context and --split apply to --text and --data only")
    return _tasks(args)


def _windows(args: argparse.Namespace) -> int:
    import torch

    from lmcore.data.tokens import TokenData
    from lmcore.eval.loading import check_vocab, load_model, load_tokenizer
    from lmcore.eval.windows import data_stream, evaluate_stream, text_stream

    dtype = None if args.dtype is None else getattr(torch, args.dtype)
    with checkpoint_warnings(args.command):
        model, info = load_model(args.model, device=args.device, dtype=dtype)
    if args.text is not None:
        missing = [f for f in args.text if not Path(f).is_file()]
        if missing:
            raise UsageError(f"--text {missing[0]!r} is not a file")
        tok, where = load_tokenizer(info, args.tokenizer)
        check_vocab(tok, model.spec.vocab_size, where)
        label = f"{where} (the checkpoint's own)" if where == info.path else str(where)
        stream = text_stream(args.text, tok, label)
    else:
        if args.tokenizer is not None:
            raise UsageError("--data brings its own tokenizer: drop --tokenizer")
        data = TokenData.open(args.data)
        data.check(context_length=1, vocab_size=model.spec.vocab_size)
        stream = data_stream(data, args.split)
    result = evaluate_stream(
        model, stream, batch_size=args.batch_size, stride=args.stride, context=args.context
    )
    params = sum(p.numel() for p in model.parameters())
    if args.json:
        print(json.dumps({"model": str(info.path), "parameters": params, **result.to_json()}))
        return 0
    dtype = str(model.lm_head.weight.dtype).removeprefix("torch.")
    overlap = "non-overlapping" if result.stride == result.context_length else "overlapping"
    print(f"model: {info.path} ({params:,} parameters, {dtype} on {model.lm_head.weight.device})")
    print(f"text: {result.source}; tokenizer {result.tokenizer}")
    left_out = f"; {result.masked:,} more read as context, left out by the loss mask" * bool(
        result.masked
    )
    print(
        f"tokens: {result.tokens:,} predicted, standing for {result.bytes:,} bytes "
        f"({result.bytes / result.tokens:.2f} bytes/token){left_out}"
    )
    print(
        f"windows: {result.windows:,} of up to {result.context_length} tokens, stride "
        f"{result.stride} ({overlap}), batch {result.batch_size}"
    )
    ppl = f"{result.perplexity:,.2f}" if result.perplexity < 1e6 else f"{result.perplexity:.3g}"
    print(
        f"loss {result.loss:.4f} nats/token   perplexity {ppl}   "
        f"bits per byte {result.bits_per_byte:.4f}"
    )
    print(f"time: {result.seconds:.2f} s, {per_second(result.tokens, result.seconds)}")
    return 0


def _tasks(args: argparse.Namespace) -> int:
    try:
        from lmcore.eval.harness import run_tasks
    except ImportError as e:  # lm-eval is an optional extra
        missing = f"no module named {e.name.partition('.')[0]!r}" if e.name else str(e)
        raise UsageError(
            f"--tasks needs the 'eval' extra (lm-evaluation-harness): pip install "
            f"'lmcore-registry[eval]' ({missing})"
        ) from None

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise UsageError("--tasks names no task; give e.g. --tasks lambada_openai,hellaswag")
    out = None if args.output is None else _output(Path(args.output))  # before it all runs
    with checkpoint_warnings(args.command):
        results, table = run_tasks(
            args.model,
            tasks,
            include_path=args.include_path,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            batch_size=args.batch_size,
            device=args.device,
            dtype=args.dtype,
            tokenizer=args.tokenizer,
            seed=args.seed,
        )
    text = json.dumps(results, indent=2, default=str, ensure_ascii=False)
    if out is not None:
        try:
            with atomic_write(out, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except (OSError, LmcoreError) as e:  # checked at the start, yet: keep the results
            print(text)
            problem = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            say(f"lmcore eval: error: --output {str(out)!r} could not be written ({problem}): "
                "the results are printed above instead")  # fmt: skip
            return 1
    print(text if args.json else table, end="\n" if args.json else "")
    if out is not None and not args.json:
        print(f"results: {out}")
    return 0


RESULTS = "results.json"  # what `--output DIR` writes inside DIR


def _output(path: Path) -> Path:
    """The file `--output` names, checked before the evaluation runs so that its results are
    not lost at the end: a directory gets `results.json` inside it; an existing file is
    replaced only when it holds JSON results (an earlier run's), never another file; the
    directory is created and must take a new file. `UsageError` naming the path and the fix."""
    if path.is_dir():
        path = path / RESULTS
    if path.is_dir():
        raise UsageError(f"--output {str(path)!r} is a directory; give a file name for the results")
    if path.exists() and not _is_results(path):
        raise UsageError(
            f"--output {str(path)!r} exists and is not a results file of lmcore eval (JSON with "
            "'results'): it is left as it is; remove it or give another path"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".lmcore-eval-"):
            pass  # the directory takes a new file: the results can be written there
    except OSError as e:
        raise UsageError(
            f"--output {str(path)!r}: cannot write in {str(path.parent)!r} "
            f"({e.strerror or e}); give a path where a file can be written"
        ) from None
    return path


def _is_results(path: Path) -> bool:
    """Whether `path` is a file holding lm-eval's results as JSON (an earlier `--output`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 << 20)
        data = json.loads(head.decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "results" in data
