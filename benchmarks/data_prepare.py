"""How fast `lmcore data prepare` tokenises, against the bare `tokenizers` calls in the same run.

    python benchmarks/data_prepare.py [SOURCE ...] [--ext .py] [--exclude site-packages]
                                      [--vocab-size 10000] [--repeats 3]

Default corpus: the running Python's standard library (`sysconfig.get_paths()["stdlib"]`),
`.py` files, without `site-packages` and `test`: text every machine has, the README's main job
trains on it. Each repeat runs, interleaved so that both see the same machine load:

- encode: lmcore's encoding pass (streamed chunks, the split into train/val, both .bin files
  written, with a reused tokenizer) against the peer, the same tokenizer's `encode_batch_fast`
  over every file read whole into memory, ids concatenated into one uint16 array and written
  to one file (the least the job can cost with this library);
- train: lmcore's tokenizer training (a Python iterator over streamed chunks) against the
  peer, `Tokenizer.train(files)`, which reads the files in Rust;
- the whole command, `lmcore data prepare` in a fresh process (start-up, both passes,
  writing), with its peak resident memory.

Never run by the test suite.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers, trainers

from lmcore.data import prepare
from lmcore.data.meta import EOT
from lmcore.data.preparing import new_tokenizer
from lmcore.data.sources import find_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", default=[sysconfig.get_paths()["stdlib"]])
    parser.add_argument("--ext", action="append", default=None)
    parser.add_argument("--exclude", action="append", default=None)
    parser.add_argument("--vocab-size", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    exts = args.ext or [".py"]
    exclude = args.exclude if args.exclude is not None else ["site-packages", "test"]
    sources = [Path(s) for s in args.sources]
    files = [f.path for f in find_files(sources, extensions=exts, exclude=exclude)]
    size = sum(f.stat().st_size for f in files)
    print(f"corpus: {', '.join(args.sources)}: {len(files):,} files, {size / 2**20:.1f} MiB")

    work = Path(tempfile.mkdtemp(prefix="lmcore-bench-"))
    try:
        first = prepare(
            sources, work / "data", vocab_size=args.vocab_size, extensions=exts,
            exclude=exclude, progress=False,
        )  # fmt: skip
        tokens = first.meta.tokens
        tokenizer = work / "data" / "tokenizer.json"
        cli = shutil.which("lmcore", path=str(Path(sys.executable).parent))
        command = [
            *([cli] if cli else [sys.executable, "-m", "lmcore"]),
            "data", "prepare", *args.sources, "--out", str(work / "cli"), "--force",
            "--vocab-size", str(args.vocab_size),
            *(f"--ext={e}" for e in exts), *(f"--exclude={e}" for e in exclude),
        ]  # fmt: skip
        times: dict[str, list[float]] = {
            k: [] for k in ("encode", "encode peer", "train", "train peer", "command")
        }
        peaks: list[int] = []
        for _ in range(args.repeats):
            times["encode"].append(
                prepare(
                    sources, work / "reuse", tokenizer=tokenizer, extensions=exts,
                    exclude=exclude, force=True, progress=False,
                ).encode_seconds
            )  # fmt: skip
            times["encode peer"].append(encode_peer(files, tokenizer, work / "peer.bin"))
            times["train"].append(
                prepare(
                    sources, work / "train", vocab_size=args.vocab_size, extensions=exts,
                    exclude=exclude, force=True, progress=False,
                ).tokenizer_seconds
            )  # fmt: skip
            times["train peer"].append(train_peer(files, args.vocab_size))
            seconds, peak = run_command(command)
            times["command"].append(seconds)
            peaks.append(peak)
    finally:
        shutil.rmtree(work)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{tokens:,} tokens, vocabulary {args.vocab_size:,}; median of {args.repeats} runs\n")
    print(f"{'step':<44} {'median s':>9} {'tokens/s':>11} {'ratio':>6}")
    rows = [
        ("encode: lmcore (stream, split, write)", "encode", "encode peer"),
        ("encode: peer (encode_batch_fast, in memory)", "encode peer", "encode peer"),
        ("train tokenizer: lmcore (iterator)", "train", "train peer"),
        ("train tokenizer: peer (Tokenizer.train)", "train peer", "train peer"),
    ]
    for label, key, peer in rows:
        rate = f"{tokens / med[key]:,.0f}" if key.startswith("encode") else ""
        print(f"{label:<44} {med[key]:>9.2f} {rate:>11} {med[key] / med[peer]:>6.2f}")
    print(f"{'lmcore data prepare (fresh process)':<44} {med['command']:>9.2f}")
    mib = max(peaks) / 2**20
    print(f"peak RSS of the command: {mib:.0f} MiB for {size / 2**20:.1f} MiB of text")
    print("(times: the machine may be shared; compare the ratios, measured interleaved)")


def run_command(command: list[str]) -> tuple[float, int]:
    """Wall time and peak RSS of `command`, run from a small Python process: a child forked
    from this one would start out with this process's own (large) resident set."""
    probe = (
        "import resource, subprocess, sys, time\n"
        "start = time.perf_counter()\n"
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
        "print(time.perf_counter() - start,"
        " resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"  # Linux: KiB
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, *command], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), int(out[1])


def encode_peer(files: list[Path], tokenizer: Path, out: Path) -> float:
    tok = Tokenizer.from_file(str(tokenizer))
    start = time.perf_counter()
    texts = [f.read_bytes().decode("utf-8") for f in files]
    encoded = tok.encode_batch_fast(texts, add_special_tokens=False)
    ids = np.concatenate([np.array(e.ids, dtype=np.uint16) for e in encoded])
    ids.tofile(out)
    return time.perf_counter() - start


def train_peer(files: list[Path], vocab_size: int) -> float:
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    start = time.perf_counter()
    tok.train([str(f) for f in files], trainer)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
