"""How long `lmcore describe` takes, against `python -c "import torch"` in the same run.

    python benchmarks/describe_speed.py [--spec gpt2-xl] [--repeats 7]

Each command runs in a fresh process, interleaved so that both see the same machine load; the
script prints the median and the fastest wall-clock time of each, and their ratio to
`import torch` (the peer: the least any lmcore command can cost). Three commands are timed:
`lmcore describe SPEC` (activations from the components' declarations), the same with
`--measure` (activations measured by a forward on the meta device, which makes torch import
its compiler stack), and the peer.

Never run by the test suite.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="gpt2-xl")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    script = shutil.which("lmcore", path=str(Path(sys.executable).parent))
    lmcore = [script] if script else [sys.executable, "-m", "lmcore"]
    commands = {
        "import torch": [sys.executable, "-c", "import torch"],
        f"lmcore describe {args.spec}": [*lmcore, "describe", args.spec],
        f"lmcore describe {args.spec} --measure": [*lmcore, "describe", args.spec, "--measure"],
    }
    for command in commands.values():  # warm the file cache
        wall(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, command in commands.items():
            times[name].append(wall(command))

    peer = statistics.median(times["import torch"])
    print(f"{'command':<40} {'median s':>9} {'min s':>7} {'/ import torch':>15}")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"{name:<40} {median:>9.2f} {min(found):>7.2f} {median / peer:>15.2f}")


if __name__ == "__main__":
    main()
