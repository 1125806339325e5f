"""Memory measured in a fresh process, from its own counters, and what the conversion tests
of a long context check of their two checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import lmcore

# `kib('VmHWM')`, `kib('VmRSS')`: this process's own peak and current memory. `ru_maxrss` would
# not do: it keeps the peak of a parent that forked the process, so a test run inside a large
# pytest process would see no growth at all.
OWN_MEMORY = (
    "import re\n"
    "def kib(key):\n"
    "    return int(re.search(key + r':\\s+(\\d+) kB', open('/proc/self/status').read())[1])\n"
)


def conversion_growth(convert: str, short: Path, long: Path) -> int:
    """The bytes a fresh process's peak grows by converting `long` after `short` with
    `convert` (`"lmcore.gguf:convert_from_gguf"`), each to `<source>.safetensors`."""
    module, name = convert.split(":")
    code = OWN_MEMORY + (
        f"import json, sys\nfrom {module} import {name} as convert\n"
        "convert(sys.argv[1], sys.argv[1] + '.safetensors')\n"
        "before = kib('VmHWM')\n"
        "convert(sys.argv[2], sys.argv[2] + '.safetensors')\n"
        "print(json.dumps((kib('VmHWM') - before) * 1024))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(short), str(long)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(json.loads(done.stdout))


def assert_only_the_context_differs(short: Path, long: Path, contexts: tuple[int, int]) -> None:
    """The checkpoints converted from `short` and `long` hold the same tensors, and their specs
    differ only in context_length (`contexts`: short's, long's)."""
    a, b = contexts
    spec = str(lmcore.read_info(f"{long}.safetensors").spec)
    assert f"context_length={b}," in spec
    shorter = str(lmcore.read_info(f"{short}.safetensors").spec)
    assert spec == shorter.replace(f"context_length={a},", f"context_length={b},")
    ours, theirs = load_file(f"{long}.safetensors"), load_file(f"{short}.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
