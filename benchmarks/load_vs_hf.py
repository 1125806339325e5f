"""Loading a 135M-parameter model: `lmcore.load` against transformers' `from_pretrained`, the
peer, on the same weights (SmolLM2-135M's shape, float32, 538 MB), with each one's peak memory.

    python benchmarks/load_vs_hf.py [--rounds 3] [--checkpoint smol.safetensors]

Without --checkpoint a random model of SmolLM2-135M's shape is written; with one (e.g. the
SmolLM2 conversion of benchmarks/smollm2_gguf.py), that model. The Hugging Face directory is made
from it with `lmcore convert --to-hf`, so both load the very same tensors. Each load runs in a
fresh process (imports done before the clock starts), the two interleaved and alternating in
order so that they see the same page cache and machine load; peak memory is the process's
maximum resident set after the load less the one before it. `lmcore.load` verifies its
checksums (the default) and scans for non-finite weights; `from_pretrained` does neither.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SMOLLM2_135M = (
    "vocab_size=49152, context_length=2048, d_model=576, num_layers=30, num_heads=9, "
    "num_kv_heads=3, d_ff=1536, tie_embeddings=true, norm=rmsnorm(eps=1e-5), "
    "pos=rope(theta=100000)"
)

CHILD = """
import json, resource, sys, time
import torch
which, path = sys.argv[1], sys.argv[2]
if which == "lmcore":
    import lmcore
    load = lambda: lmcore.load(path)
else:
    import transformers
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
model = load()
with torch.no_grad():  # one forward: the weights really are there
    model(torch.tensor([[1, 2, 3]]))
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "peak_bytes": (peak - before) * 1024}))
"""


def run(which: str, path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which, str(path)], check=True, capture_output=True, text=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint
        if ckpt is None:
            import torch

            import lmcore

            torch.manual_seed(0)
            ckpt = lmcore.build_model(SMOLLM2_135M).save(Path(tmp) / "m.safetensors")
        hf = Path(tmp) / "hf"
        lmcore_cli = [sys.executable, "-m", "lmcore.cli.main"]
        subprocess.run(
            [*lmcore_cli, "convert", "--to-hf", str(ckpt), str(hf)], check=True, capture_output=True
        )
        weights = (hf / "model.safetensors").stat().st_size
        times: dict[str, list[float]] = {"lmcore": [], "hf": []}
        peaks: dict[str, list[float]] = {"lmcore": [], "hf": []}
        run("lmcore", ckpt), run("hf", hf)  # warm the page cache for both
        for i in range(args.rounds):
            order = ("lmcore", "hf") if i % 2 == 0 else ("hf", "lmcore")
            for which in order:
                r = run(which, ckpt if which == "lmcore" else hf)
                times[which].append(r["seconds"])
                peaks[which].append(r["peak_bytes"])
        lm, theirs = statistics.median(times["lmcore"]), statistics.median(times["hf"])
        print(f"weights: {weights / 2**20:.0f} MiB; {args.rounds} interleaved rounds, median")
        for which, t in (("lmcore.load", lm), ("from_pretrained", theirs)):
            key = "lmcore" if which == "lmcore.load" else "hf"
            peak = max(peaks[key])
            print(
                f"{which:16} {t:6.2f} s   peak +{peak / 2**20:5.0f} MiB "
                f"({peak / weights:.2f}x the weights)"
            )
        print(f"ratio lmcore / transformers: {lm / theirs:.2f}x")


if __name__ == "__main__":
    main()
