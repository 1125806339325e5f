"""Decoding cost against context length, per mixer: the time of one cached decoding step at
batch 1 after a prompt of 256 tokens and after one of 4,096, in one process.

    python benchmarks/decode_context.py [--rounds 5] [--steps 32] [--contexts 256 4096]
                                        [--mixers attention gated_deltanet ...] [--threads N]

Each mixer runs in a model of the same shape (vocab 10000, d_model 512, 4 layers, 8 heads,
d_ff 1344, context_length 4,096 + steps) that differs only in `mixer=`. For each context, the
prompt is fed once through the cache (not timed), then 3 single tokens (not timed) and
`--steps` more, each timed on its own (the median is the round's time); a round does this for every mixer and context in turn (interleaved,
so load on a shared machine falls on all of them alike), and the table gives the median per
token over the rounds, and the ratio of the longest context's time to the shortest's. An
attention layer reads every cached key and value at each step, so its time grows with the
context; a recurrent mixer's state has one size whatever the context, so its step should not.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lmcore import build_model
from lmcore.registry import get_registry
from lmcore.model.cache import DecodingCache
from lmcore.model.transformer import TransformerLM

SHAPE = "vocab_size=10000, d_model=512, num_layers=4, num_heads=8, d_ff=1344"


def step_time(model: TransformerLM, context: int, steps: int) -> float:
    """The median seconds of a cached single-token step after a prompt of `context - 4`
    tokens."""
    cache = DecodingCache.for_model(model, 1, model.spec.context_length)  # never grown while timed
    prompt = torch.randint(0, model.spec.vocab_size, (1, context - 4))
    token = torch.randint(0, model.spec.vocab_size, (1, 1))
    times = []
    with torch.inference_mode():
        model(prompt, cache=cache)
        for _ in range(3):  # warm the single-token path before timing it
            model(token, cache=cache)
        for _ in range(steps):
            start = time.perf_counter()
            model(token, cache=cache)
            times.append(time.perf_counter() - start)
    return statistics.median(times)  # a step's time, whatever hiccup hit a few of them


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32, help="timed tokens per context")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--mixers", nargs="+", default=None, help="default: every registered")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contexts = sorted(args.contexts)
    mixers = args.mixers or get_registry().names("mixer")
    length = contexts[-1] + args.steps
    models = {}
    for name in mixers:
        torch.manual_seed(0)
        models[name] = build_model(f"{SHAPE}, context_length={length}, mixer={name}").eval()
    times: dict[tuple[str, int], list[float]] = {(m, c): [] for m in mixers for c in contexts}
    for _ in range(args.rounds):
        for name, model in models.items():
            for c in contexts:
                times[name, c].append(step_time(model, c, args.steps))
    print(
        f"per-token decoding time, batch 1, float32, {torch.get_num_threads()} threads, "
        f"median of {args.rounds} rounds of {args.steps} steps ({SHAPE})\n"
    )
    head = " | ".join(f"context {c}" for c in contexts)
    print(f"| mixer | {head} | {contexts[-1]} / {contexts[0]} |")
    print("| --- |" + " ---: |" * (len(contexts) + 1))
    for name in mixers:
        ms = [statistics.median(times[name, c]) * 1e3 for c in contexts]
        cells = " | ".join(f"{t:.2f} ms" for t in ms)
        print(f"| `{name}` | {cells} | {ms[-1] / ms[0]:.2f}× |")


if __name__ == "__main__":
    main()
