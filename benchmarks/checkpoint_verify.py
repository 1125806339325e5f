"""What verifying a checkpoint costs: `lmcore.load` with its checksum check (the default) against
`lmcore.load(verify=False)`, the peer, on a random model of SmolLM2-135M's shape.

    python benchmarks/checkpoint_verify.py [--pairs 5] [--threads 1]

The file is written once (float32, 134,515,008 parameters, 538 MB) and loaded in interleaved
pairs, the order alternating, so that both see the same page cache and machine load. Also timed
alone: `verify_checksums` (one CRC-32 pass over the mapped file) and the non-finite scan
(`check_finite`, which `load` runs either way unless `nonfinite="ignore"`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import lmcore
from lmcore.checkpoint import check_finite, read_info, verify_checksums

SMOLLM2_135M = (
    "vocab_size=49152, context_length=2048, d_model=576, num_layers=30, num_heads=9, "
    "num_kv_heads=3, d_ff=1536, tie_embeddings=true, norm=rmsnorm(eps=1e-5), "
    "pos=rope(theta=100000)"
)


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = lmcore.build_model(SMOLLM2_135M)
        n = sum(p.numel() for p in model.parameters())
        path = model.save(Path(tmp) / "m.safetensors")
        state = {k: v.detach() for k, v in model.state_dict().items()}
        del model
        info = read_info(path)
        lmcore.load(path)  # warm the page cache and the registry
        with_v, without, ratios = [], [], []
        for i in range(args.pairs):
            order = [True, False] if i % 2 == 0 else [False, True]
            got = {v: timed(lambda v=v: lmcore.load(path, verify=v)) for v in order}
            with_v.append(got[True])
            without.append(got[False])
            ratios.append(got[True] / got[False])
        crc = [timed(lambda: verify_checksums(info)) for _ in range(args.pairs)]
        finite = [timed(lambda: check_finite(state, path)) for _ in range(args.pairs)]
    med = statistics.median
    print(f"{n:,} parameters, {info.size / 1e6:.0f} MB, {args.pairs} pairs, "
          f"{args.threads} thread(s)")  # fmt: skip
    print("| load | median s | ratio to verify=False, median of pairs (range) |")
    print("| --- | ---: | ---: |")
    print(f"| `lmcore.load(path)` (checksums verified) | {med(with_v):.2f} | "
          f"{med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")  # fmt: skip
    print(f"| `lmcore.load(path, verify=False)` (peer) | {med(without):.2f} | 1.00 |")
    print(f"| `verify_checksums(info)` alone | {med(crc):.2f} | |")
    print(f"| `check_finite` alone (in both loads) | {med(finite):.2f} | |")


if __name__ == "__main__":
    main()
