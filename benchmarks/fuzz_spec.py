# ruff: noqa: E501  (the report table reads best one row a line)
"""Fuzz `parse_spec` with mutated specs: only `SpecError`s, bounded time, round trips.

    python benchmarks/fuzz_spec.py [--count 100000] [--large 300] [--seed 0]

Starting from valid specs (the presets, the manual's examples, specs using every component and
argument), each input is a valid spec changed by one to four random mutations: characters
deleted, inserted (from the grammar's alphabet, quotes, escapes, control and non-ASCII
characters) or replaced; spans duplicated, moved or repeated hundreds of times; numbers
replaced by huge or malformed ones; names replaced by long or qualified ones (quoted
distribution names too); two specs spliced. `--large` more inputs are grown to 100 KB - 1 MB
(thousands of arguments, keys or a long string or name).

For every input it records what `parse_spec` did: returned a spec (which must round-trip:
`parse_spec(str(s)) == s`), raised `SpecError` (whose text must stay under 4,000 characters),
or raised anything else (a bug, listed with its input); and how long it took, as seconds per
100 KB of text (at least 100 KB counted, so a short input is held to one second). The script
exits 1 if any input raised something other than a `SpecError`, failed to round-trip, took
more than 1 s per 100 KB, or had an over-long message.

Never run by the test suite (tests/test_spec.py runs a short hypothesis version).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter

import lmcore
from lmcore import SpecError, parse_spec

SEEDS = [
    "tinystories",
    "cs336-tiny",
    "gpt2-xl",
    "tinystories, pos=nope",
    "tinystories, norm=rmsnorm(eps=1e-6), ffn=swiglu(d_ff=2048), pos=rope(theta=500000.0)",
    "vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344,"
    "\n  norm=rmsnorm(eps=1e-5), ffn=swiglu, pos=rope(theta=10000), attn=sdpa",
    "tinystories, num_kv_heads=4, block=postnorm, tie_embeddings=true",
    "tinystories, norm=layernorm(bias=false, eps=1e-5), ffn=gelu, pos=alibi",
    "tinystories, attn=chunked(block_size=64), pos=sinusoidal(base=10_000.0)",
    'tinystories, norm="lmcore-registry":rmsnorm, pos=lmcore-registry:learned',
    "gpt2-small, context_length=2048, num_heads=8, ffn=geglu, norm=none",
    "cs336-tiny, ffn=relu(d_ff=96), d_model=128, num_heads=8, num_kv_heads=1",
]
ALPHABET = [
    *"abcdeflmnoprstuxyz_-.:,=()'\" 0123456789eE+\\\n\t;{}[]#$",
    "é", "€", "\x00", "\u200b", "𝔵", "\ufffd", "\r",
]  # fmt: skip
WORDS = [
    "tinystories", "cs336-tiny", "d_model", "num_heads", "num_kv_heads", "d_ff", "norm", "ffn",
    "pos", "attn", "rope", "rmsnorm", "swiglu", "sdpa", "theta", "eps", "block_size", "bias",
    "true", "false", "prenorm", "postnorm", '"2norms":', "lmcore-registry:", '"my norms":',
    "1e-5", "1e400", "-1", "0", "0.0", "1_000", "1__0", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", "1e", ".5", "5.", "+3", "0x10", "nan", "inf",
]  # fmt: skip


MAX_MUTATED = 200_000  # characters a mutated spec is cut to


def mutate(text: str, rng: random.Random) -> str:
    """One random mutation of `text`."""
    n = len(text)
    i, j = sorted(rng.randrange(n + 1) for _ in range(2))
    op = rng.randrange(12)
    if op == 0:  # delete a span
        return text[:i] + text[j:]
    if op == 1:  # insert characters
        return text[:i] + "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))) + text[i:]
    if op == 2 and n:  # replace a character
        return text[:i] + rng.choice(ALPHABET) + text[i + 1 :]
    if op == 3:  # duplicate a span
        return text[:j] + text[i:j] + text[j:]
    if op == 4:  # repeat a span many times
        return text[:j] + text[i:j] * rng.randint(2, 300) + text[j:]
    if op == 5:  # a huge or odd number
        digits = rng.choice([19, 20, 40, 401, 5000])
        number = rng.choice(
            ["1" + "0" * digits, "9" * digits, "1e" + "9" * 5, "0." + "0" * digits + "1"]
        )
        return text[:i] + number + text[i:]
    if op == 6:  # a word from the grammar
        return text[:i] + rng.choice(WORDS) + text[j if rng.random() < 0.5 else i :]
    if op == 7:  # a long name or string
        body = rng.choice(["x", "ab", "é", "\\n"]) * rng.choice([10, 1000, 50_000])
        return text[:i] + rng.choice(["", '"', "'"]) + body + text[i:]
    if op == 8:  # splice another seed in
        other = rng.choice(SEEDS)
        return text[:i] + other[rng.randrange(len(other)) :]
    if op == 9:  # swap two spans
        k = rng.randrange(j, n + 1)
        return text[:i] + text[j:k] + text[i:j] + text[k:]
    if op == 10:  # an extra argument or item
        return (
            text[:i] + rng.choice([", d_model=64", "(eps=1)", ", x=1", "=", ",,", "()"]) + text[i:]
        )
    return (
        text.upper() if rng.random() < 0.1 else text.replace(",", rng.choice([";", ", ,", " , "]))
    )


def grow(rng: random.Random) -> str:
    """An input of 100 KB to 1 MB."""
    n = rng.choice([5_000, 20_000, 60_000, 100_000])
    kind = rng.randrange(5)
    if kind == 0:
        return "tinystories, norm=rmsnorm(" + ", ".join(f"a{i}=1" for i in range(n)) + ")"
    if kind == 1:
        return "tinystories" + ", d_model=512" * n
    if kind == 2:
        return 'tinystories, norm=rmsnorm(eps="' + "x" * (10 * n) + '")'
    if kind == 3:
        return "tinystories, pos=" + "r" * (10 * n)
    return mutate(" ".join(rng.choice(SEEDS) for _ in range(n // 100 + 1)), rng)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="mutated specs")
    parser.add_argument("--large", type=int, default=300, help="more inputs of 100 KB - 1 MB")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    parse_spec("tinystories")  # load the registry outside the timings

    outcomes: Counter[str] = Counter()
    bugs: list[tuple[str, str]] = []
    slow: list[tuple[float, int]] = []
    worst = (0.0, 0)  # (seconds per 100 KB, length)
    longest_message, longest_text = 0, ""
    total_chars, total_seconds = 0, 0.0
    inputs = [None] * args.count + ["large"] * args.large
    start = time.perf_counter()
    for n, what in enumerate(inputs):
        if what is None:
            text = rng.choice(SEEDS)
            for _ in range(rng.randint(1, 4)):
                text = mutate(text, rng)[:MAX_MUTATED]  # repeats compound: keep them bounded
        else:
            text = grow(rng)
        t0 = time.perf_counter()
        try:
            spec = parse_spec(text)
        except SpecError as e:
            outcome, message = "SpecError", str(e)
        except Exception as e:  # a bug: anything but SpecError
            outcome, message = type(e).__name__, str(e)
            bugs.append((f"{outcome}: {message[:200]}", text[:300]))
        else:
            outcome, message = "spec", ""
            if parse_spec(str(spec)) != spec:
                bugs.append(("does not round-trip", text[:300]))
        seconds = time.perf_counter() - t0
        outcomes[outcome] += 1
        total_chars += len(text)
        total_seconds += seconds
        if len(message) > longest_message:
            longest_message, longest_text = len(message), message
        per_100kb = seconds / max(len(text), 100_000) * 100_000
        if per_100kb > worst[0]:
            worst = (per_100kb, len(text))
        if per_100kb > 1.0:
            slow.append((seconds, len(text)))
        if (n + 1) % 20_000 == 0:
            print(f"  {n + 1:,} inputs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    elapsed = time.perf_counter() - start

    print(f"lmcore {lmcore.__version__}, seed {args.seed}")
    print(f"| inputs | {len(inputs):,} ({args.count:,} mutated, {args.large:,} of 100 KB - 1 MB) |")
    print("|---|---|")
    for outcome, count in outcomes.most_common():
        print(f"| {outcome} | {count:,} |")
    print(f"| exceptions other than SpecError, and round-trip failures | {len(bugs)} |")
    print(f"| inputs over 1 s per 100 KB | {len(slow)} |")
    print(
        f"| slowest, per 100 KB (at least 100 KB counted) | {worst[0]:.3f} s ({worst[1]:,} characters) |"
    )
    print(f"| longest SpecError text | {longest_message:,} characters |")
    print(
        f"| text parsed | {total_chars / 1e6:.1f} MB in {total_seconds:.1f} s of parse_spec ({elapsed:.0f} s in all) |"
    )
    if longest_message >= 4_000:
        bugs.append((f"a SpecError of {longest_message:,} characters", longest_text[:300]))
    for problem, text in bugs[:20]:
        print(f"BUG {problem}\n    input: {text!r}")
    return 0 if not bugs and not slow else 1


if __name__ == "__main__":
    sys.exit(main())
