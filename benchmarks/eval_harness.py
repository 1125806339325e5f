"""lm-evaluation-harness with lmcore's model against lm-eval's own `hf` model, on the same
weights (an lmcore checkpoint and its `lmcore convert --to-hf` copy), the same requests, in one
process.

    python benchmarks/eval_harness.py [--rounds 3] [--questions 100] [--docs 30] [--batch 8]
                                      [--threads N]

Two local tasks are written to a temporary directory from this Python's standard library: a
multiple-choice task (a ~150-token stretch of code, then the line that follows it against
three lines from elsewhere, as hellaswag-style tasks are built) and a rolling-perplexity task
(whole modules of ~600 tokens, longer than the context). The model: vocab 2048 (a byte-level
BPE trained on the same library), context 256, d_model 256, 4 layers, 8 heads, random weights.
Each round runs both tasks with each backend in turn (interleaved, so load on a shared machine
falls on both alike); the table gives the median seconds of `simple_evaluate` (model loading
included) and the ratio hf / lmcore (above 1: lmcore is faster). Before the table, the largest
difference between the two backends' per-request log-likelihoods and their accuracies.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SPEC = "vocab_size=2048, context_length=256, d_model=256, num_layers=4, num_heads=8"
EOT = "<|endoftext|>"
TASKS = ["bench_mc", "bench_ppl"]


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)
    return files


def write_tasks(root: Path, files: list[Path], tok: Any, questions: int, docs: int) -> None:
    rng = random.Random(0)
    lines = [ln for f in files for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()]
    mc = []
    while len(mc) < questions:
        i = rng.randrange(len(lines) - 60)
        ctx, n = [], 0
        while n < 150:
            ctx.append(lines[i])
            n += len(tok.encode(lines[i] + "\n").ids)
            i += 1
        choices = [lines[i].strip(), *(lines[rng.randrange(len(lines))].strip() for _ in range(3))]
        order = list(range(4))
        rng.shuffle(order)
        mc.append({"q": "\n".join(ctx) + "\n", "choices": [choices[k] for k in order],
                   "answer": order.index(0)})  # fmt: skip
    ppl = []
    for f in rng.sample(files, docs):
        ids = tok.encode(f.read_text(encoding="utf-8")).ids[:600]
        ppl.append({"text": tok.decode(ids)})
    for name, rows in (("mc", mc), ("ppl", ppl)):
        with open(root / f"{name}.jsonl", "w", encoding="utf-8") as out:
            out.writelines(json.dumps(r) + "\n" for r in rows)
    (root / "mc.yaml").write_text(
        f"task: bench_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
        f"{root / 'mc.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{q}}"\ndoc_to_choice: choices\ndoc_to_target: answer\n'
        "target_delimiter: ''\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (root / "ppl.yaml").write_text(
        f"task: bench_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
        f"{root / 'ppl.jsonl'}\ntest_split: test\noutput_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n  - metric: bits_per_byte\n'
    )


def build(root: Path, files: list[Path]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    import lmcore
    from lmcore.hf.convert import convert_to_hf

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator((f.read_text(encoding="utf-8") for f in files[:80]), trainer)
    (root / "lm").mkdir()
    torch.manual_seed(0)
    lmcore.save(lmcore.build_model(SPEC), root / "lm" / "model.safetensors")
    tok.save(str(root / "lm" / "tokenizer.json"))
    convert_to_hf(root / "lm" / "model.safetensors", root / "hf")
    config = json.loads((root / "hf" / "config.json").read_text())
    config.update(eos_token_id=0, bos_token_id=0)
    (root / "hf" / "config.json").write_text(json.dumps(config))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(root / "hf")
    return tok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--docs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    import lm_eval
    from lm_eval.tasks import TaskManager

    import lmcore.eval.harness  # noqa: F401  (registers "lmcore")

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = stdlib_files()
        tok = build(root, files)
        (root / "tasks").mkdir()
        write_tasks(root / "tasks", files, tok, args.questions, args.docs)
        manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)
        peers = {
            "lm-eval `hf` (transformers Llama)": ("hf", f"pretrained={root / 'hf'},dtype=float32"),
            "lm-eval `lmcore`": ("lmcore", f"pretrained={root / 'lm'}"),
        }
        times: dict[str, list[float]] = {name: [] for name in peers}
        last: dict[str, Any] = {}
        for _ in range(args.rounds):
            for name, (model, model_args) in peers.items():
                start = time.perf_counter()
                last[name] = lm_eval.simple_evaluate(
                    model=model, model_args=model_args, tasks=TASKS, task_manager=manager,
                    batch_size=args.batch, device="cpu", log_samples=True,
                )  # fmt: skip
                times[name].append(time.perf_counter() - start)
        (hf, ours) = (last[n] for n in peers)
        for task in TASKS:
            worst = 0.0
            for x, y in zip(hf["samples"][task], ours["samples"][task], strict=True):
                for rx, ry in zip(x["resps"], y["resps"], strict=True):
                    a, b = rx[0], ry[0]
                    a, b = (a[0], b[0]) if isinstance(a, tuple | list) else (a, b)
                    worst = max(worst, abs(a - b))
            shown = {k: round(v, 4) for k, v in ours["results"][task].items() if "," in k
                     and "stderr" not in k}  # fmt: skip
            same = all(hf["results"][task][k] == near(v) for k, v in shown.items())
            print(f"{task}: largest |Δ log-likelihood| {worst:.2e}; lmcore {shown}; hf: {same}")
    n_mc, n_ppl = args.questions * 4, args.docs
    print(f"\n{n_mc} loglikelihood + {n_ppl} loglikelihood_rolling requests, batch {args.batch}, "
          f"{torch.get_num_threads()} threads, median of {args.rounds} rounds\n")  # fmt: skip
    hf_s = statistics.median(times[next(iter(peers))])
    print("| backend | seconds | hf / this |\n| --- | ---: | ---: |")
    for name, ts in times.items():
        s = statistics.median(ts)
        print(f"| {name} | {s:.2f} | {hf_s / s:.2f} |")
    sys.stdout.flush()


def near(value: float) -> Any:
    """Equal to `value` within 5e-5 (the results are rounded to 4 decimals above)."""

    class _Near:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, float | int) and abs(float(other) - value) < 5e-5

    return _Near()


if __name__ == "__main__":
    main()
